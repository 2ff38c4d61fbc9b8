"""The weight fingerprint's coefficients and sums
(``sparse_dp.training.dp_state.weight_fingerprint``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.training.dp_state import weight_fingerprint as wf


def _reference_coefficients(index: int, positions: np.ndarray, stride: int) -> np.ndarray:
  """The definition by its direct formula (Python integers: no overflow to hide)."""
  m = wf._MODULUS
  out = []
  for p in positions.tolist():
    h = ((p % m) * stride + index * wf._VARIABLE) % m
    h = (h * wf._MIX + 1) % m
    out.append((-1.0 if (h >> 7) & 1 else 1.0) * (1.0 + h / 2**31))
  return np.array(out)


def _reference_sum(index: int, values: np.ndarray) -> float:
  values = values.reshape(-1, values.shape[-1]).astype(np.float64)
  a = _reference_coefficients(index, np.arange(values.shape[0]), wf._ROW)
  b = _reference_coefficients(index, np.arange(values.shape[1]), wf._COLUMN)
  return float(a @ values @ b)


def test_coefficients_are_the_direct_formula_for_any_position_and_variable():
  rng = np.random.default_rng(0)
  m = wf._MODULUS
  positions = np.concatenate([np.arange(300), [m - 2, m - 1, m, m + 1, 2 * m, 2**40 + 3, 2**62],
                              rng.integers(0, 2**62, 500)]).astype(np.int64)
  for index in (0, 1, 7, 25, 300):
    for stride in (wf._ROW, wf._COLUMN):
      got = wf._coefficients(index, tf.constant(positions), stride).numpy()
      np.testing.assert_array_equal(got, _reference_coefficients(index, positions, stride))
  signs = wf._coefficients(3, tf.range(10_000, dtype=tf.int64), wf._ROW).numpy()
  assert 0.45 < (signs < 0).mean() < 0.55 and np.all((np.abs(signs) >= 1) & (np.abs(signs) < 2))


def test_a_table_over_one_chunk_is_read_in_chunks_and_a_move_is_found():
  rows = wf._CHUNK_ROWS + 4_321  # a full chunk and a shorter last one
  table = tf.Variable(tf.random.stateless_normal([rows, 5], seed=[1, 2]))
  dense = tf.Variable(tf.random.stateless_normal([7, 3], seed=[3, 4]))
  bias = tf.Variable(tf.random.stateless_normal([3], seed=[5, 6]))
  state = tf.Variable(0.0, dtype=tf.float64)
  fingerprint = wf.Fingerprint([table, dense, bias], state)
  total, magnitude = fingerprint.compute()
  expected = sum(_reference_sum(i, v.numpy()) for i, v in enumerate([table, dense, bias]))
  assert total == pytest.approx(expected, rel=1e-12, abs=1e-9)
  assert magnitude == pytest.approx(sum(np.abs(v.numpy()).sum(dtype=np.float64)
                                        for v in (table, dense, bias)), rel=1e-12)
  state.assign(total)
  assert not fingerprint.moved()
  table.scatter_update(tf.IndexedSlices(tf.ones([1, 5]) * 1e-3, [rows - 1]))  # the last chunk
  assert fingerprint.moved()


@pytest.mark.parametrize("move", ["swap_rows", "swap_columns", "swap_variables", "shift"])
def test_moves_that_keep_every_value_are_found(move):
  """Rows or columns permuted, two same-shaped variables exchanged, a constant added: the
  coefficients are distinct reals, so none of these keeps the fingerprint."""
  first = tf.Variable(tf.random.stateless_normal([50, 4], seed=[7, 8]))
  second = tf.Variable(tf.random.stateless_normal([50, 4], seed=[9, 10]))
  state = tf.Variable(0.0, dtype=tf.float64)
  fingerprint = wf.Fingerprint([first, second], state)
  state.assign(fingerprint.compute()[0])
  values = first.numpy()
  if move == "swap_rows":
    first.assign(values[[1, 0, *range(2, 50)]])
  elif move == "swap_columns":
    first.assign(values[:, [1, 0, 2, 3]])
  elif move == "swap_variables":
    first.assign(second.numpy())
    second.assign(values)
  else:
    first.assign(values + 1e-4)
  assert fingerprint.moved()


@pytest.mark.parametrize("sparse", [True, False])
def test_the_step_keeps_the_fingerprint_current_through_its_update(sparse):
  """``before_update``/``after_update`` around an update (selected rows, or every row as a
  DP-SGD table's) keep ``s`` equal to a full read, in graph mode and under XLA."""
  for jit in (False, True):
    table = tf.Variable(tf.random.stateless_normal([40, 6], seed=[1, 1]))
    state = tf.Variable(0.0, dtype=tf.float64)
    fingerprint = wf.Fingerprint([table], state)
    state.assign(fingerprint.compute()[0])
    rows = tf.constant([3, 17, 39] if sparse else list(range(40)), tf.int64)
    update = tf.IndexedSlices(tf.ones([int(rows.shape[0]), 6]) * 0.5, rows, tf.constant([40, 6]))

    @tf.function(jit_compile=jit)
    def step():
      read, gradients = fingerprint.before_update({table.ref(): update})
      gradient = gradients[table.ref()]
      table.scatter_sub(gradient)
      with tf.control_dependencies([table.handle]):
        fingerprint.after_update(read)

    step()
    assert not fingerprint.moved(), (sparse, jit)


@pytest.mark.parametrize("jit", [False, True])
def test_one_stack_reads_every_tables_rows_and_every_small_weight(jit):
  """Tables of different widths (selected rows then ``PAD``, a refused step's repeated row 0,
  a table without rows) and Dense weights of different shapes, updated in one step: ``s``
  stays equal to a full read. In graph mode the row lists' lengths are unknown when traced."""
  tables = [tf.Variable(tf.random.stateless_normal([rows, width], seed=[rows, width]))
            for rows, width in ((30, 4), (50, 7), (9, 2), (12, 3))]
  small = [tf.Variable(tf.random.stateless_normal(shape, seed=[len(shape), 8]))
           for shape in ([7, 3], [3], [3, 5], [])]
  variables = tables + small
  state = tf.Variable(0.0, dtype=tf.float64)
  fingerprint = wf.Fingerprint(variables, state)
  state.assign(fingerprint.compute()[0])
  pad = wf.PAD
  # Table 1 starts with table 0's last row, and repeats it (as a refused step repeats row 0).
  row_lists = [[2, 5, 29], [29, 29, 29], [], [1, 11, pad, pad]]
  unknown_lengths = None if jit else [tf.TensorSpec([None], tf.int64)] * len(tables)

  @tf.function(jit_compile=jit, input_signature=unknown_lengths)
  def step(*rows):
    updates = {}
    for table, table_rows in zip(tables, rows):
      values = tf.ones([tf.size(table_rows), table.shape[1]]) * 0.25
      updates[table.ref()] = tf.IndexedSlices(values, table_rows, tf.shape(table, tf.int64))
    for variable in small:
      updates[variable.ref()] = tf.ones_like(variable) * 0.5
    read, gradients = fingerprint.before_update(updates)
    ops = []
    for table in tables:
      gradient = gradients[table.ref()]
      valid = tf.not_equal(gradient.indices, pad)
      first = tf.concat([[True], tf.not_equal(gradient.indices[1:], gradient.indices[:-1])], 0)
      keep = tf.logical_and(valid, first)  # a lazy optimizer moves each row once
      ops.append(table.scatter_sub(tf.IndexedSlices(
          tf.boolean_mask(gradient.values, keep), tf.boolean_mask(gradient.indices, keep))))
    ops += [variable.assign_sub(gradients[variable.ref()]) for variable in small]
    with tf.control_dependencies(ops):
      fingerprint.after_update(read)

  step(*[tf.constant(rows, tf.int64) for rows in row_lists])
  assert not fingerprint.moved()
  assert float(state.numpy()) == pytest.approx(fingerprint.compute()[0], rel=1e-12)
  tables[1].scatter_add(tf.IndexedSlices(tf.ones([1, 7]) * 1e-3, [40]))  # a row no step read
  assert fingerprint.moved()
