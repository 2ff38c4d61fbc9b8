"""Tables laid end to end: stacking and splitting give each table back its rows and widths."""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.mechanisms import PAD, StackedTables
from sparse_dp.mechanisms.noise.row_noise import row_sparse_noise

SIZES, WIDTHS = [7, 1, 12, 5], [3, 5, 1, 4]


def _random_rows(rng):
  rows = [rng.choice(size, rng.integers(0, size + 1), replace=False) for size in SIZES]
  values = [rng.normal(size=(len(r), width)).astype(np.float32) for r, width in zip(rows, WIDTHS)]
  return rows, values


def _sorted_stack(stacked, rows, values, extra_padding=3):
  flat_rows, flat_values = stacked.stack([tf.constant(r, tf.int64) for r in rows],
                                         [tf.constant(v) for v in values])
  order = tf.argsort(flat_rows)
  padded_rows = tf.concat([tf.gather(flat_rows, order), tf.fill([extra_padding], PAD)], 0)
  padded_values = tf.concat([tf.gather(flat_values, order),
                             tf.zeros([extra_padding, stacked.width])], 0)
  return padded_rows, padded_values


@pytest.mark.parametrize("seed", range(5))
def test_split_gives_each_table_its_rows_and_values_back(seed):
  rng = np.random.default_rng(seed)
  stacked = StackedTables(SIZES, WIDTHS)
  rows, values = _random_rows(rng)
  sorted_rows, sorted_values = _sorted_stack(stacked, rows, values)
  assert sorted_values.shape[1] == max(WIDTHS)
  for (got_rows, got_values), want_rows, want_values in zip(
      stacked.split(sorted_rows, sorted_values), rows, values):
    order = np.argsort(want_rows)
    np.testing.assert_array_equal(got_rows.numpy(), want_rows[order])
    np.testing.assert_array_equal(got_values.numpy(), want_values[order])


def test_split_into_rooms_pads_with_pad_rows_of_zeros_and_cuts_past_the_room():
  stacked = StackedTables(SIZES, WIDTHS)
  rows = [np.array([0, 3, 6]), np.array([0]), np.array([2, 4, 11]), np.array([], np.int64)]
  values = [np.full((len(r), w), t + 1.0, np.float32) for t, (r, w) in enumerate(zip(rows,
                                                                                    WIDTHS))]
  sorted_rows, sorted_values = _sorted_stack(stacked, rows, values)
  parts = stacked.split(sorted_rows, sorted_values, rooms=[5, 1, 2, 2])
  np.testing.assert_array_equal(parts[0][0].numpy(), [0, 3, 6, PAD, PAD])
  np.testing.assert_array_equal(parts[0][1].numpy()[3:], 0.0)
  np.testing.assert_array_equal(parts[1][0].numpy(), [0])
  np.testing.assert_array_equal(parts[2][0].numpy(), [2, 4])  # cut: the caller flags it
  np.testing.assert_array_equal(parts[3][0].numpy(), [PAD, PAD])
  assert [p[1].shape for p in parts] == [(5, 3), (1, 5), (2, 1), (2, 4)]


@pytest.mark.parametrize("jit", [False, True])
def test_split_into_rooms_known_from_the_batch_shape_compiles_and_leaves_empty_parts(jit):
  """Rooms as the DP step makes them (from the batch's shape, constants once XLA knows it),
  one of them empty, and a table without rows: each part as in graph mode."""
  stacked = StackedTables(SIZES, WIDTHS)
  rows = [np.array([1, 6]), np.array([0]), np.array([], np.int64), np.array([0, 2, 4])]
  values = [np.full((len(r), w), t + 1.0, np.float32) for t, (r, w) in enumerate(zip(rows,
                                                                                    WIDTHS))]
  sorted_rows, sorted_values = _sorted_stack(stacked, rows, values)

  @tf.function(jit_compile=jit)
  def split(batch):
    size = tf.shape(batch, out_type=tf.int64)[0]  # 2
    return stacked.split(sorted_rows, sorted_values, rooms=[size + 1, size - 2, size, size + 2])

  parts = split(tf.zeros([2]))
  # No prefix sum over the parts' positions (quadratic on XLA:CPU): only over the T lengths.
  graph = split.get_concrete_function(tf.TensorSpec([2])).graph
  assert all(op.inputs[0].shape.as_list() == [len(SIZES)]
             for op in graph.get_operations() if op.type == "Cumsum")
  np.testing.assert_array_equal(parts[0][0].numpy(), [1, 6, PAD])
  np.testing.assert_array_equal(parts[0][1].numpy(), [[1.0] * 3, [1.0] * 3, [0.0] * 3])
  assert parts[1][0].shape == (0,) and parts[1][1].shape == (0, 5)  # row 0 cut: flagged
  np.testing.assert_array_equal(parts[2][0].numpy(), [PAD, PAD])
  np.testing.assert_array_equal(parts[3][0].numpy(), [0, 2, 4, PAD])
  np.testing.assert_array_equal(parts[3][1].numpy()[:3], 4.0)
  np.testing.assert_array_equal(parts[3][1].numpy()[3], 0.0)


def test_stack_rows_shifts_each_tables_rows_and_keeps_pad_whether_lengths_are_known():
  stacked = StackedTables(SIZES, WIDTHS)
  rows = [[0, 6, PAD], [0], [], [PAD, 4]]
  want = [0, 6, PAD, 7, PAD, 24]
  known = stacked.stack_rows([tf.constant(r, tf.int64) for r in rows])
  unknown = tf.function(lambda *r: stacked.stack_rows(list(r)), input_signature=[
      tf.TensorSpec([None], tf.int64)] * len(rows))(*[tf.constant(r, tf.int64) for r in rows])
  np.testing.assert_array_equal(known.numpy(), want)
  np.testing.assert_array_equal(unknown.numpy(), want)


def test_each_row_has_the_coordinates_of_its_table_and_pad_has_none():
  stacked = StackedTables(SIZES, WIDTHS)
  rows = tf.constant([0, 6, 7, 8, 19, 24, PAD], tf.int64)
  mask = stacked.coordinate_mask(rows).numpy()
  np.testing.assert_array_equal(mask.sum(axis=1), [3, 3, 5, 1, 1, 4, 0])
  np.testing.assert_array_equal(stacked.table_of(rows).numpy(), [0, 0, 1, 2, 2, 3, 4])


def test_stacked_noise_has_each_tables_law_on_its_own_coordinates_only():
  """Each selected row of table t: N(0, s^2) on its d_t coordinates, exact zeros elsewhere."""
  stacked = StackedTables([4000, 3000], [2, 6])
  rows = tf.concat([tf.range(0, 7000, dtype=tf.int64), tf.fill([50], PAD)], 0)
  noise = row_sparse_noise(rows, tf.zeros([7050, 6]), 1.5, tf.constant([4, 2], tf.int64),
                           stacked.coordinate_mask(rows)).numpy()
  first, second = noise[:4000], noise[4000:7000]
  np.testing.assert_array_equal(first[:, 2:], 0.0)
  np.testing.assert_array_equal(noise[7000:], 0.0)
  for block in (first[:, :2], second):
    assert np.all(block != 0.0)
    assert abs(block.std() - 1.5) < 0.05 and abs(block.mean()) < 0.05


def test_bad_sizes_or_widths_are_refused():
  with pytest.raises(ValueError, match="one positive size and width per table"):
    StackedTables([3, 4], [2])
  with pytest.raises(ValueError, match="one positive size and width per table"):
    StackedTables([3, 0], [2, 2])


@pytest.mark.parametrize("num_tables", [3, 100])  # compared pairwise, and searched
def test_table_of_and_bounds_agree_with_numpy(num_tables):
  rng = np.random.default_rng(num_tables)
  sizes = rng.integers(1, 20, num_tables)
  stacked = StackedTables(sizes, [2] * num_tables)
  rows = np.sort(rng.choice(stacked.num_rows, stacked.num_rows // 2, replace=False))
  padded = tf.constant(np.concatenate([rows, [PAD] * 4]), tf.int64)
  ends = np.cumsum(sizes)
  np.testing.assert_array_equal(stacked.table_of(padded).numpy(),
                                np.concatenate([np.searchsorted(ends, rows, side="right"),
                                                [num_tables] * 4]))
  first, last = stacked.bounds(padded)
  starts = np.concatenate([[0], ends[:-1]])
  np.testing.assert_array_equal(first.numpy(), np.searchsorted(rows, starts, side="left"))
  np.testing.assert_array_equal(last.numpy(), np.searchsorted(rows, ends, side="left"))
