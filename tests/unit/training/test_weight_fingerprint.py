"""The weight fingerprint's signs and sums (``sparse_dp.training.dp_state.weight_fingerprint``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.training.dp_state import weight_fingerprint as wf


def _reference_signs(index: int, rows: np.ndarray, width: int) -> np.ndarray:
  """The fingerprint's definition, by its direct formula: three ``mod M`` and ``// 7``."""
  m = wf._MODULUS
  rows = np.mod(rows.astype(np.int64), m)
  h = np.mod(rows[:, None] * wf._ROW + np.arange(width, dtype=np.int64)[None, :] * wf._COLUMN
             + index * wf._VARIABLE, m)
  h = np.mod(h * wf._MIX + 1, m)
  return 1.0 - 2.0 * np.mod(h // 7, 2)


def test_signs_are_the_direct_formulas_for_any_row_column_and_variable():
  rng = np.random.default_rng(0)
  m = wf._MODULUS
  rows = np.concatenate([np.arange(300), [m - 2, m - 1, m, m + 1, 2 * m, 2**40 + 3, 2**62],
                         rng.integers(0, 2**62, 2000)]).astype(np.int64)
  for index in (0, 1, 7, 25, 300):
    for width in (1, 3, 64, 598):
      expected = _reference_signs(index, rows, width)
      in_step = wf._signs(index, tf.constant(rows), width).numpy()
      full_read = wf._signs_of_terms(wf._row_terms(tf.constant(rows)),
                                     wf._column_terms(index, width)).numpy()
      np.testing.assert_array_equal(in_step, expected, err_msg=f"variable {index}, width {width}")
      np.testing.assert_array_equal(full_read, expected, err_msg=f"variable {index}, width {width}")
  # Balanced enough to be a fingerprint: about half of the signs are -1.
  assert 0.45 < (wf._signs(3, tf.range(10_000, dtype=tf.int64), 64).numpy() < 0).mean() < 0.55


def test_a_table_over_one_chunk_is_summed_by_the_compiled_pass_and_a_move_is_found():
  rows = wf._CHUNK_ROWS + 4_321  # a full chunk, compiled, and a shorter last one
  table = tf.Variable(tf.random.stateless_normal([rows, 5], seed=[1, 2]))
  dense = tf.Variable(tf.random.stateless_normal([7, 3], seed=[3, 4]))
  state = tf.Variable(0.0, dtype=tf.float64)
  fingerprint = wf.Fingerprint([table, dense], state)
  total, magnitude = fingerprint.compute()
  expected = sum(float(np.sum(_reference_signs(i, np.arange(v.shape[0]), v.shape[1])
                              * v.numpy().astype(np.float64)))
                 for i, v in enumerate([table, dense]))
  assert total == pytest.approx(expected, rel=1e-12, abs=1e-9)
  assert magnitude == pytest.approx(np.abs(table.numpy()).sum(dtype=np.float64)
                                    + np.abs(dense.numpy()).sum(dtype=np.float64), rel=1e-6)
  fingerprint.reset()
  assert not fingerprint.moved()
  table.scatter_update(tf.IndexedSlices(tf.ones([1, 5]) * 1e-3, [rows - 1]))  # the last chunk
  assert fingerprint.moved()
