"""The DP record is bound to the weights it describes, for every algorithm
(``sparse_dp.training.dp_state.provenance``): weights moved by any route outside the DP step,
or loaded from a source without a matching record, get no epsilon, are not saved, and are
refused by a later ``make_private``."""

from __future__ import annotations

import copy
import functools
import types

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.training import WeightsMovedOutsideDPError

N, B, VOCAB = 64, 16, 20

CONFIGS = {
    "dpsgd": sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, noise_seed=2),
    "fest": sparse_dp.DPConfig("fest", noise_multiplier=1.0, selection_epsilon=0.5,
                               noise_seed=2),
    "adafest": sparse_dp.DPConfig("adafest", sigma1=1.0, sigma2=1.0, threshold=2.0,
                                  noise_seed=2),
}


def build(tables=1, seed=1):
  """One table and a Dense head, or two tables of a matrix factorisation (their dot product,
  no other weight), compiled."""
  keras.utils.set_random_seed(seed)
  inputs = [keras.Input(shape=(), dtype=tf.int64) for _ in range(tables)]
  embedded = [Embedding(VOCAB, 4)(ids) for ids in inputs]
  output = (keras.layers.Dense(1)(embedded[0]) if tables == 1
            else keras.layers.Dot(axes=1)(embedded))
  model = keras.Model(inputs if tables > 1 else inputs[0], output)
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def data(rows=N, tables=1):
  rng = np.random.default_rng(1)
  ids = [rng.integers(0, VOCAB, rows).astype("int64") for _ in range(tables)]
  return (tuple(ids) if tables > 1 else ids[0]), rng.integers(0, 2, (rows, 1)).astype("float32")


def trained(algorithm, tables=1):
  model = build(tables)
  private = sparse_dp.make_private(model, CONFIGS[algorithm], num_examples=N, batch_size=B)
  model.fit(private.poisson_dataset(*data(tables=tables)), verbose=0)
  assert private.epsilon() > 0
  return model, private


def refused(private):
  with pytest.raises(WeightsMovedOutsideDPError):
    private.epsilon()
  with pytest.raises(WeightsMovedOutsideDPError):
    private.report()


@functools.lru_cache(maxsize=None)
def plain_weights(tables=1):
  """The weights of the same architecture trained without DP on the same data (fit once)."""
  twin = build(tables, seed=5)
  twin.fit(*data(tables=tables), epochs=2, verbose=0)
  return tuple(twin.get_weights())


def plain_twin(tables=1):
  """The same architecture trained without DP on the same data: a new model each call."""
  twin = build(tables, seed=5)
  twin.set_weights([w.copy() for w in plain_weights(tables)])
  return twin


def covered_again(model, private, own):
  """Loads the model's own saved weights back: covered again (as before a move)."""
  model.load_weights(own)
  assert private.epsilon() > 0


def bindings(model):
  """The model's weight fingerprint, and each record holder's ``dp_record`` words and trainable
  weights, as arrays."""
  from sparse_dp.training.dp_state.state import record_holders

  return (float(model.dp_state.weight_fingerprint.numpy()),
          tuple((layer.dp_record.numpy(), tuple(w.numpy() for w in layer.trainable_weights))
                for layer in record_holders(model)))


@pytest.fixture(scope="module")
def saved_dp_model(tmp_path_factory):
  """``saved(algorithm)``: the folder ``model.save`` wrote of a DP-trained model, its table's
  name, record and rows, and its :func:`bindings`; one DP run per algorithm for the tests that
  only read them (copies: a test may change what it gets)."""
  @functools.lru_cache(maxsize=None)
  def saved(algorithm):
    model, _ = trained(algorithm)
    table = model.layers[1]
    rows = table.name, table.dp_record.numpy(), table.embeddings.numpy()
    read = bindings(model)
    folder = tmp_path_factory.mktemp(algorithm) / "dp_model"
    model.save(str(folder))
    return (str(folder), *rows, read)

  return lambda algorithm: copy.deepcopy(saved(algorithm))


def shared_fit(model, private, _):
  """A plain model on the DP model's table, fit: the table moved."""
  ids = keras.Input(shape=(), dtype=tf.int64)
  plain = keras.Model(ids, keras.layers.Dense(1)(model.layers[1](ids)))
  plain.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  plain.fit(*data(), verbose=0)
  refused(private)


def tape_update(model, private, _):
  """An optimizer applies a tape's gradient to the table."""
  table = model.layers[1]
  optimizer = keras.optimizers.legacy.SGD(0.5)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(data()[0][:8]))
  optimizer.apply_gradients([(tape.gradient(loss, table.embeddings), table.embeddings)])
  refused(private)


def assign(model, private, _):
  """An assign to the table."""
  table = model.layers[1]
  table.embeddings.assign_add(tf.ones_like(table.embeddings) * 1e-3)
  refused(private)


def twin_route(route):
  """The weights of a non-private twin (:func:`plain_twin`) arrive by ``route``: not covered,
  and not saved."""
  def move(model, private, tmp_path):
    twin = plain_twin()
    if route == "set_weights":
      model.set_weights(twin.get_weights())
    else:
      path = str(tmp_path / ("twin.h5" if route == "load_weights_h5" else "twin"))
      twin.save_weights(path)
      model.load_weights(path)
    np.testing.assert_array_equal(model.layers[1].embeddings.numpy(),
                                  twin.layers[1].embeddings.numpy())
    refused(private)
    with pytest.raises(WeightsMovedOutsideDPError):
      model.save_weights(str(tmp_path / f"laundered_{route}"))
    assert not (tmp_path / f"laundered_{route}.index").exists()
  move.__name__ = route
  return move


def second_make_private(model, private, _):
  """A second ``make_private`` after the Dense head, then the table, moved is refused."""
  model.layers[-1].kernel.assign_add(tf.ones_like(model.layers[-1].kernel))  # Dense only
  refused(private)
  with pytest.raises(WeightsMovedOutsideDPError, match="optimizer.iterations"):
    sparse_dp.make_private(model, CONFIGS["dpsgd"], num_examples=N, batch_size=B)
  model.layers[1].embeddings.assign_add(tf.ones_like(model.layers[1].embeddings))
  with pytest.raises(WeightsMovedOutsideDPError, match="layer"):
    sparse_dp.make_private(model, CONFIGS["dpsgd"], num_examples=N, batch_size=B)


def new_head(model, private, _):
  """A new head on the DP-trained table: the table's own part of the binding covers it (a last
  step: its ``make_private`` rewrites the shared table's ``dp_record``)."""
  ids = keras.Input(shape=(), dtype=tf.int64)
  second = keras.Model(ids, keras.layers.Dense(1)(model.layers[1](ids)))
  second.compile(optimizer=keras.optimizers.legacy.SGD(0.1),
                 loss=keras.losses.BinaryCrossentropy(from_logits=True))
  assert sparse_dp.make_private(second, CONFIGS["dpsgd"], num_examples=N,
                                batch_size=B).epsilon() >= private.epsilon()


MOVES = (shared_fit, tape_update, assign)
ROUTES = tuple(twin_route(route) for route in ("set_weights", "load_weights_h5",
                                               "load_weights_tf"))
STEPS = {"dpsgd": (*ROUTES, *MOVES, second_make_private, new_head),
         "fest": (*MOVES, *ROUTES),
         "adafest": (*MOVES, *ROUTES)}


@pytest.mark.parametrize("algorithm", list(CONFIGS))
def test_weights_moved_outside_dp_or_taken_from_a_non_private_twin_are_refused(algorithm,
                                                                              tmp_path):
  """Every algorithm's tables are fingerprinted, DP-SGD's and DP-FEST's included: a table moved
  by a plain model, a tape or an assign, and a non-private twin's weights set or loaded, are
  refused. One DP run per algorithm: its own weights, loaded back, are covered again before
  each later step. DP-SGD's run takes the twin's weights right after its DP steps, the others'
  a plain model's fit; DP-SGD's goes on to a second ``make_private`` and a new head."""
  model, private = trained(algorithm)
  own = str(tmp_path / "own.h5")
  model.save_weights(own)
  for index, step in enumerate(STEPS[algorithm]):
    if index:
      covered_again(model, private, own)
    step(model, private, tmp_path)


def test_a_replaced_train_function_trains_without_dp_and_no_epsilon_is_given():
  """Two tables of a matrix factorisation (no Dense), the make_train_function replaced by a
  plain one with its own optimizer: five epochs without DP, no epsilon."""
  model, private = trained("dpsgd", tables=2)
  optimizer = keras.optimizers.legacy.SGD(0.5)

  def plain_train_function(self, force=False):
    @tf.function
    def step(iterator):
      x, y, _ = keras.utils.unpack_x_y_sample_weight(next(iterator))
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(self.compiled_loss(y, self(x, training=True)))
      optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables),
                                    self.trainable_variables))
      return {"loss": loss}
    self.train_function = step
    return step

  model.make_train_function = types.MethodType(plain_train_function, model)
  model.train_function = None
  x, y = data(tables=2)
  model.fit(x, y, batch_size=B, epochs=5, verbose=0)
  refused(private)


def test_plain_fit_on_the_data_before_make_private_is_refused():
  model = build()
  model.fit(*data(), verbose=0)
  with pytest.raises(WeightsMovedOutsideDPError, match="fresh optimizer"):
    sparse_dp.make_private(model, CONFIGS["dpsgd"], num_examples=N, batch_size=B)
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1),  # declares the weights public
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  assert sparse_dp.make_private(model, CONFIGS["dpsgd"], num_examples=N,
                                batch_size=B).epsilon() == 0.0


@pytest.mark.parametrize("algorithm", ["dpsgd", "adafest"])
def test_a_reloaded_dp_model_fine_tuned_without_dp_is_refused(algorithm, saved_dp_model):
  folder = saved_dp_model(algorithm)[0]
  reloaded = keras.models.load_model(folder)
  assert sparse_dp.make_private(reloaded, CONFIGS[algorithm], num_examples=N,
                                batch_size=B).epsilon() > 0  # as saved: covered
  again = keras.models.load_model(folder)
  again.fit(*data(), verbose=0)  # a plain fine-tune of the reloaded model
  with pytest.raises(WeightsMovedOutsideDPError):
    sparse_dp.make_private(again, CONFIGS[algorithm], num_examples=N, batch_size=B)


def test_distilling_a_teacher_whose_weights_moved_after_its_record_is_refused(saved_dp_model,
                                                                             tmp_path):
  """``distill --teacher`` reads the teacher's epsilon from its record: only for the weights
  that record describes."""
  from sparse_dp.jobs.distill.dp_teacher import teacher_privacy

  teacher = saved_dp_model("adafest")[0]
  assert teacher_privacy(keras.models.load_model(teacher))["epsilon"] > 0
  tuned = keras.models.load_model(teacher)
  tuned.fit(*data(), verbose=0)  # fine-tuned without DP, then saved as a teacher
  tuned.save(str(tmp_path / "tuned"))
  with pytest.raises(WeightsMovedOutsideDPError):
    teacher_privacy(keras.models.load_model(str(tmp_path / "tuned")))


def test_initial_weights_loaded_before_any_step_are_taken_as_initial():
  """set_weights of public initial weights after make_private but before any DP step: as if
  they were loaded before make_private."""
  model = build()
  private = sparse_dp.make_private(model, CONFIGS["dpsgd"], num_examples=N, batch_size=B)
  model.set_weights(build(seed=9).get_weights())
  assert private.epsilon() == 0.0
  model.fit(private.poisson_dataset(*data()), verbose=0)
  assert private.epsilon() > 0


def test_a_streams_carried_rows_are_bound_only_if_the_saved_rows_were_the_records(
    saved_dp_model):
  """A stream period carries a table's rows over to a new preselection (post-processing of
  DP weights): the saved rows must be those the record describes, then the record is bound
  to the carried rows."""
  from sparse_dp.training.dp_state.dp_record import decode_binding
  from sparse_dp.training.dp_state.provenance import rebound_record

  _, name, words, saved, _ = saved_dp_model("adafest")
  carried = saved[[3, 1, 4]]
  rebound = rebound_record(words, name, [saved], [carried])
  binding = decode_binding(rebound)
  index = decode_binding(words).indices[0]
  from sparse_dp.training.dp_state.weight_fingerprint import read_sum
  assert binding.layer == pytest.approx(read_sum(index, carried)[0], rel=1e-12)
  with pytest.raises(WeightsMovedOutsideDPError, match=name):
    rebound_record(words, name, [saved + 1e-3], [carried])


@pytest.mark.parametrize("tables", [1, 2])
def test_every_layers_binding_follows_its_own_weights_through_the_steps(tables, saved_dp_model):
  """After DP steps, each table's record holds the fingerprint of the whole model (with the
  Dense head's weights, when there is one) and the part of it from that table alone, as a
  fresh read of the weights gives. One table: the DP run :func:`saved_dp_model` saved."""
  from sparse_dp.training.dp_state.dp_record import decode_binding
  from sparse_dp.training.dp_state.weight_fingerprint import read_sum

  total, holders = (saved_dp_model("adafest")[-1] if tables == 1
                    else bindings(trained("adafest", tables)[0]))
  assert len(holders) == tables
  for words, weights in holders:
    binding = decode_binding(words)
    assert binding.model == total
    assert len(binding.indices) == len(weights)
    fresh = sum(read_sum(index, weight)[0] for index, weight in zip(binding.indices, weights))
    assert binding.layer == pytest.approx(fresh, rel=1e-12, abs=1e-12)
