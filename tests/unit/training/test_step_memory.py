"""No temporary the size of a table in a training step, except DP-SGD's noise, one table at a time
(on a table of more rows than ``mechanisms.noise.dense_noise.CHUNK_ROWS``, one chunk at a time).

The checks read the traced step's graph (no step runs), on two tables whose
row counts appear nowhere else in the model, so a tensor with that many rows
is a table-sized temporary: a dense read of the table, a densified
``IndexedSlices``, a full-table mask or noise.
"""

import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.noise import dense_noise

from support.graph_ops import ancestors

ROWS = (100_003, 70_001)


def _traced_step(algorithm: str) -> tf.Graph:
  keras.utils.set_random_seed(3)
  ids = keras.Input(shape=(2,), dtype=tf.int64)
  tables = [Embedding(rows, 2, name=f"table_{i}")(ids[:, i]) for i, rows in enumerate(ROWS)]
  model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Concatenate()(tables)))
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  config = {"none": sparse_dp.DPConfig("none"),
            "dpsgd": sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, noise_seed=1),
            "adafest": sparse_dp.DPConfig("adafest", sigma1=1.0, sigma2=1.0, threshold=5.0,
                                          noise_seed=1)}[algorithm]
  sparse_dp.make_private(model, config, num_examples=10_000, batch_size=64)
  # The optimizer's hyperparameter variables, made now: made by the first trace, they would
  # have tf.function trace the step a second time (the graph is the same).
  model.optimizer.learning_rate
  spec = (tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None, 1], tf.float32))
  return tf.function(model.train_step).get_concrete_function(spec).graph


def _table_sized(op: tf.Operation) -> bool:
  return any(map(_table_sized_tensor, op.outputs))


@pytest.mark.parametrize("algorithm", ["none", "adafest"])
def test_sparse_steps_make_no_table_sized_tensor(algorithm):
  graph = _traced_step(algorithm)
  sized = [f"{op.type} {op.name} {[t.shape for t in op.outputs]}"
           for op in graph.get_operations() if _table_sized(op)]
  assert not sized


def test_dpsgd_draws_one_table_noise_at_a_time_after_the_backward_pass():
  graph = _traced_step("dpsgd")
  # The noise's random words: one uint64 per two floats, so one per row at dim 2.
  draws = sorted((op for op in graph.get_operations()
                  if op.type == "StatelessRandomUniformFullIntV2" and _table_sized(op)),
                 key=lambda op: -op.outputs[0].shape[0])
  assert [op.outputs[0].shape[0] for op in draws] == list(ROWS)
  first, second = (ancestors(op) for op in draws)
  # The first table's draw waits for the batch (its clipped sum), not only for the seed ...
  assert any(op.type == "Placeholder" and op.outputs[0].dtype == tf.int64 for op in first)
  # ... and the second table's for the first table's noisy gradient.
  assert any(op.type == "RealDiv" and _table_sized(op) for op in second)
  # No op holds several noisy table gradients at once before they are applied.
  assert not [op.name for op in graph.get_operations()
              if op.type == "IdentityN" and sum(map(_table_sized_tensor, op.inputs)) > 1]


def _table_sized_tensor(tensor: tf.Tensor) -> bool:
  return bool(tensor.shape.rank) and tensor.shape[0] in ROWS


def test_dpsgd_on_large_tables_draws_one_chunk_at_a_time_into_one_gradient(monkeypatch):
  monkeypatch.setattr(dense_noise, "CHUNK_ROWS", 2**14)  # 7 and 5 chunks
  graph = _traced_step("dpsgd")
  draws = [op for op in graph.get_operations() if op.type == "StatelessRandomUniformFullIntV2"]
  assert max(op.outputs[0].shape.num_elements() or 0 for op in draws) == 2**14  # a chunk, dim 2
  # Each table's chunks are drawn in order, each after the previous chunk's noise is added.
  for rows in ROWS:
    adds = [op for op in graph.get_operations()
            if op.type == "TensorStridedSliceUpdate" and op.outputs[0].shape == (rows, 2)]
    assert len(adds) == -(-rows // 2**14)
    assert all(earlier in ancestors(later) for earlier, later in zip(adds, adds[1:]))
  # The only ops with an output of a table's size make its gradient, in one chain: a buffer,
  # each chunk written in, divided by the batch size, read for the norm, then the
  # optimizer's (SGD's -lr g, a scatter into the variable); no tensor of a table's size has
  # two readers of a table's size (no copy beside it, no densified update).
  whole = [op for op in graph.get_operations()
           if any(tuple(t.shape) in {(rows, 2) for rows in ROWS} for t in op.outputs)]
  assert {op.type for op in whole} == {"Empty", "TensorStridedSliceUpdate", "RealDiv",
                                        "Identity", "Neg", "Mul"}
  for op in whole:
    readers = [c for c in op.outputs[0].consumers() if c in whole]
    assert len(readers) <= 1, (op.name, [c.name for c in readers])
  assert len([op for op in whole if op.type == "Empty"]) == len(ROWS)
