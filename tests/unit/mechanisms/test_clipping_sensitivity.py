"""Clipping bounds sensitivity: one added example moves the clipped sums by <= C1 and C2."""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.mechanisms import (
  clip_factors,
  clipped_row_sum,
  contribution_maps,
  is_valid,
  per_example_row_gradients,
  restrict_to_rows,
  squared_norms,
)

VOCAB_A, VOCAB_B, DIM = 5000, 3000, 4


def random_batch(rng, batch):
  table_a = tf.ragged.constant([rng.integers(0, VOCAB_A, rng.integers(1, 4)).tolist()
                                for _ in range(batch)], tf.int64)
  table_b = tf.constant(rng.integers(0, VOCAB_B, batch), tf.int64)
  return table_a, table_b


def with_example(ids, new_ids):
  if isinstance(ids, tf.RaggedTensor):
    return tf.concat([ids, tf.ragged.constant([new_ids], tf.int64)], axis=0)
  return tf.concat([ids, tf.constant(new_ids, tf.int64)], axis=0)


def trimmed(contribution):
  """The map's rows and values without its padding."""
  valid = is_valid(contribution.rows)
  return tf.boolean_mask(contribution.rows, valid), tf.boolean_mask(contribution.values, valid)


def dense_map(contribution, vocabulary):
  rows, values = trimmed(contribution)
  return tf.scatter_nd(rows[:, None], values, [vocabulary]).numpy()


@pytest.mark.parametrize("c1", [1.0, 5.0])
def test_contribution_map_moves_by_at_most_c1(c1):
  rng = np.random.default_rng(0)
  table_a, table_b = random_batch(rng, 300)
  before = contribution_maps([table_a, table_b], c1)
  # One example touching 3000 rows of A (some repeated) and one row of B.
  greedy = rng.integers(0, VOCAB_A, 3000).tolist() + [7] * 50
  after = contribution_maps([with_example(table_a, greedy), with_example(table_b, [3])], c1)
  diff = np.concatenate([dense_map(after[0], VOCAB_A) - dense_map(before[0], VOCAB_A),
                         dense_map(after[1], VOCAB_B) - dense_map(before[1], VOCAB_B)])
  assert np.linalg.norm(diff) == pytest.approx(c1, rel=1e-5)  # clipped exactly to C1
  small = contribution_maps([tf.constant([[1, 2]], tf.int64), tf.constant([9], tf.int64)], c1)
  assert np.linalg.norm(np.concatenate([m.values.numpy() for m in small])) <= c1 * (1 + 1e-6)


def test_contribution_counts_each_activated_row_once_across_layouts():
  ragged = tf.ragged.constant([[4, 4, 1], [1], []], tf.int64)
  sparse = ragged.to_sparse()
  (a,), (b,) = contribution_maps([ragged], 10.0), contribution_maps([sparse], 10.0)
  # One entry per lookup: the distinct rows, then padding (PAD, value 0).
  assert a.rows.shape == (4,)
  np.testing.assert_array_equal(trimmed(a)[0].numpy(), [1, 4])
  np.testing.assert_allclose(a.values.numpy(), [2.0, 1.0, 0.0, 0.0])
  np.testing.assert_allclose(b.values.numpy(), a.values.numpy())
  # Dense [B, L] ids; norm sqrt(2) per example clipped to 1.
  (d,) = contribution_maps([tf.constant([[0, 1], [1, 2]], tf.int64)], 1.0)
  np.testing.assert_allclose(trimmed(d)[1].numpy(), [1, 2, 1] / np.sqrt(2), rtol=1e-6)


def clipped_sums(per_table, dense_grads, selected, c2):
  """Clipped sum of every parameter, densified for comparison (small tables only)."""
  batch = tf.constant(dense_grads.shape[0], tf.int64)
  masked = [restrict_to_rows(g, rows) for g, rows in zip(per_table, selected)]
  total = tf.add_n([squared_norms(g, batch) for g in masked]) + tf.reduce_sum(dense_grads ** 2, 1)
  factors = clip_factors(total, c2)
  tables = [tf.convert_to_tensor(clipped_row_sum(g, factors, [v, DIM])).numpy().ravel()
            for g, v in zip(masked, (VOCAB_A, VOCAB_B))]
  dense = tf.reduce_sum(dense_grads * factors[:, None], 0).numpy()
  return np.concatenate(tables + [dense])


def lookups(rng, ids, scale=1.0):
  """Per-lookup (example, row, output gradient) of ragged or dense ids."""
  if isinstance(ids, tf.RaggedTensor):
    example, row = ids.value_rowids(), ids.flat_values
  else:
    example, row = tf.range(tf.size(ids, out_type=tf.int64)), ids
  grads = tf.constant(rng.normal(size=(row.shape[0], DIM)) * scale, tf.float32)
  return example, row, grads


@pytest.mark.parametrize("c2", [0.5, 3.0])
def test_clipped_gradient_sum_moves_by_at_most_c2(c2):
  rng = np.random.default_rng(1)
  table_a, table_b = random_batch(rng, 200)
  greedy = rng.integers(0, VOCAB_A, 3000).tolist()
  selected = [tf.range(0, VOCAB_A, 2, dtype=tf.int64), tf.range(VOCAB_B, dtype=tf.int64)]

  def sums(ids_a, ids_b, dense):
    batch = tf.constant(dense.shape[0], tf.int64)
    per_table = [per_example_row_gradients(*lookups(np.random.default_rng(7), ids),
                                           batch_size=batch) for ids in (ids_a, ids_b)]
    return per_table, dense

  base_dense = tf.constant(rng.normal(size=(200, 6)), tf.float32)
  before = clipped_sums(*sums(table_a, table_b, base_dense), selected, c2)
  # The added example: an enormous gradient on 3000 rows of A, one of B, and dense weights.
  ids_a, ids_b = with_example(table_a, greedy), with_example(table_b, [5])
  per_table, _ = sums(ids_a, ids_b, tf.zeros([201, 6]))
  last = [tf.equal(g.example, 200) for g in per_table]
  per_table = [g._replace(values=tf.where(m[:, None], g.values * 1e6, g.values))
               for g, m in zip(per_table, last)]
  dense = tf.concat([base_dense, tf.fill([1, 6], 1e6)], 0)
  after = clipped_sums(per_table, dense, selected, c2)
  assert np.linalg.norm(after - before) <= c2 * (1 + 1e-5)
  assert np.linalg.norm(after - before) == pytest.approx(c2, rel=1e-4)


def test_repeated_lookups_sum_before_the_norm():
  grads = per_example_row_gradients(tf.constant([0, 0, 1], tf.int64),
                                    tf.constant([3, 3, 3], tf.int64),
                                    tf.constant([[1.0, 0], [1.0, 0], [0, 2.0]]),
                                    tf.constant(2, tf.int64))
  np.testing.assert_allclose(squared_norms(grads, tf.constant(2, tf.int64)).numpy(), [4.0, 4.0])
  summed = clipped_row_sum(grads, clip_factors(tf.constant([4.0, 4.0]), 1.0), [5, 2])
  np.testing.assert_allclose(tf.convert_to_tensor(summed).numpy()[3], [1.0, 1.0])
