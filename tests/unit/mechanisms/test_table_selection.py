"""One selection for all tables has the law of independent per-table selections."""

import functools
import itertools

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from sparse_dp.mechanisms import PAD, false_positive_capacity, select_rows_of_tables
from sparse_dp.mechanisms.rows.stacking import StackedTables
from sparse_dp.mechanisms.selection import row_selection, table_selection

from support.stacks import ALPHA

SIZES = (12, 5, 9)
C1, TAU, STD = 1.5, 1.0, 0.8
# (example, row) lookups of a batch of 4 per table; example 0 repeats a row (it counts once).
LOOKUPS = ([(0, 3), (0, 3), (1, 3), (2, 7), (3, 0), (3, 11)],
           [(0, 1), (1, 1), (2, 1), (3, 4)],
           [(1, 8), (2, 2), (3, 2)])
BATCH = 4


def pairs():
  return [(tf.constant([e for e, _ in lookups], tf.int64),
           tf.constant([r for _, r in lookups], tf.int64)) for lookups in LOOKUPS]


def reference_probabilities():
  """Each row's selection probability, from the contribution map clipped jointly over tables."""
  distinct = [sorted(set(lookups)) for lookups in LOOKUPS]
  activated = np.zeros(BATCH)
  for table in distinct:
    for example, _ in table:
      activated[example] += 1
  weight = np.minimum(1.0, C1 / np.sqrt(np.maximum(activated, 1)))
  probabilities = []
  for size, table in zip(SIZES, distinct):
    contribution = np.zeros(size)
    for example, row in table:
      contribution[row] += weight[example]
    probabilities.append(stats.norm.sf((TAU - contribution) / STD))  # 0 rows: Psi(tau / std)
  return probabilities


def select(seed):
  return select_rows_of_tables(pairs(), SIZES, tf.constant(BATCH, tf.int64), C1, TAU, STD, seed)


def selected(selections):
  return [np.array([r for r in s.rows.numpy() if r != PAD], np.int64) for s in selections]


def draws(seed, trials):
  """``select(seed + trial)`` for each trial, as numpy: one graph call (``tf.map_fn`` runs the
  same ops on each seed; 3,000 calls cost more), each table's fields with a first axis of
  trials."""
  spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, select(seed))
  seeds = seed[None] + tf.range(trials, dtype=tf.int64)[:, None]
  every = tf.function(lambda seeds: tf.map_fn(select, seeds, fn_output_signature=spec))(seeds)
  return tf.nest.map_structure(lambda t: t.numpy(), every)


def test_rows_are_selected_at_the_per_table_rates_and_independently_across_tables(seed):
  trials = 3000
  chosen = [np.zeros((trials, size), bool) for size in SIZES]
  for table, selection in zip(chosen, draws(seed, trials)):
    for trial_rows, rows in zip(table, selection.rows):
      trial_rows[rows[rows != PAD]] = True
  probabilities = reference_probabilities()
  # Every row of every table at its rate: sum of squared z-scores ~ chi2(rows).
  hits = np.concatenate([table.sum(0) for table in chosen])
  p = np.concatenate(probabilities)
  z2 = (hits - trials * p) ** 2 / (trials * p * (1 - p))
  assert stats.chi2.sf(z2.sum(), len(p)) > ALPHA
  # Independent across tables: each pair of tables' counts (above / at most their
  # median) form a 2 x 2 table with no association.
  counts = [table.sum(1) for table in chosen]
  for a, b in itertools.combinations(counts, 2):
    above_a, above_b = a > np.median(a), b > np.median(b)
    table = [[np.sum(above_a & above_b), np.sum(above_a & ~above_b)],
             [np.sum(~above_a & above_b), np.sum(~above_a & ~above_b)]]
    assert stats.chi2_contingency(table)[1] > ALPHA
  # And row by row: every two contributed rows of different tables.
  for (t, table), (u, other) in itertools.combinations(enumerate(chosen), 2):
    for row, other_row in itertools.product({r for _, r in LOOKUPS[t]}, {r for _, r in LOOKUPS[u]}):
      x, y = table[:, row], other[:, other_row]
      counts_2x2 = [[np.sum(x & y), np.sum(x & ~y)], [np.sum(~x & y), np.sum(~x & ~y)]]
      assert stats.chi2_contingency(counts_2x2)[1] > ALPHA
  # Within a table, rows independently: the count's variance is the Binomial sum's.
  for table, q in zip(chosen, probabilities):
    n = table.sum(1)
    assert stats.chi2.ppf(ALPHA / 2, trials - 1) <= (
        (trials - 1) * n.var(ddof=1) / np.sum(q * (1 - q))) <= stats.chi2.isf(ALPHA / 2, trials - 1)


def test_each_table_gets_its_own_rows_counts_and_room(seed):
  selections = select(seed)
  probability = stats.norm.sf(TAU / STD)
  for size, lookups, selection, rows in zip(SIZES, LOOKUPS, selections, selected(selections)):
    assert selection.rows.shape == (len(lookups) + false_positive_capacity(size, probability),)
    assert np.all(np.diff(rows) > 0) and np.all((0 <= rows) & (rows < size))
    assert np.all(selection.rows.numpy()[len(rows):] == PAD)
    contributed = {row for _, row in lookups}
    true_positives = len(contributed & set(rows.tolist()))
    assert int(selection.num_true_positives) == true_positives
    assert int(selection.num_dropped) == len(contributed) - true_positives
    assert int(selection.num_false_positives) == len(rows) - true_positives
    assert int(selection.num_selected) == len(rows) and not bool(selection.over_capacity)


def full_draws(seed):
  """``select(seed + trial)`` for 200 trials, at the room the library makes: drawn (one trace)
  once for the tests that cut it, as tensors (immutable)."""
  return _full_draws(tuple(seed.numpy().tolist()))


@functools.lru_cache(maxsize=None)
def _full_draws(seed_words):
  draw, seed = tf.function(select), tf.constant(seed_words, tf.int64)
  return tuple(draw(seed + trial) for trial in range(200))


def test_a_table_whose_false_positives_overflow_its_room_is_flagged(seed, monkeypatch):
  full = full_draws(seed)
  # No room for table 2's false positives: only its 3 pairs' worth of rows fit.
  real = table_selection.false_positive_capacity
  monkeypatch.setattr(table_selection, "false_positive_capacity",
                      lambda size, p: 0 if size == 9 else real(size, p))
  tight_draw = tf.function(select)  # traced after the patch
  tight = [tight_draw(seed + trial) for trial in range(200)]
  overflowed = 0
  for whole, cut in zip(full, tight):
    assert not any(bool(s.over_capacity) for s in whole + cut[:2])
    assert bool(cut[2].over_capacity) == (int(whole[2].num_selected) > 3)
    np.testing.assert_array_equal(cut[2].rows.numpy(), whole[2].rows.numpy()[:3])
    overflowed += bool(cut[2].over_capacity)
  assert overflowed > 0


def test_the_tables_past_the_last_false_positive_of_a_full_joint_draw_are_flagged(
    seed, monkeypatch):
  full = full_draws(seed)
  # Room for one false positive over all tables (row_selection's bound: the joint one).
  monkeypatch.setattr(row_selection, "false_positive_capacity", lambda size, p, *_: 1)
  tight_draw = tf.function(select)  # traced after the patch
  cut_tables = 0
  for trial, whole in enumerate(full):
    cut = tight_draw(seed + trial)
    for a, b in zip(whole, cut):
      # Every table whose rows the full draw would change is flagged.
      if not np.array_equal(selected([a])[0], selected([b])[0]):
        assert bool(b.over_capacity)
    cut_tables += sum(bool(b.over_capacity) for b in cut)
    flags = [bool(b.over_capacity) for b in cut]
    assert flags == sorted(flags)  # from the table of the cut on
  assert cut_tables > 0


@pytest.mark.parametrize("sizes", [(10 ** 6, 3, 10 ** 5), (1, 1, 1)])
def test_the_selection_compiles_with_xla_to_the_same_rows(seed, sizes):
  lookups = [(0, 5), (1, 5), (2, 40)]
  table_pairs = [(tf.constant([e for e, _ in lookups], tf.int64),
                  tf.constant([r % size for _, r in lookups], tf.int64)) for size in sizes]
  table_pairs[1] = (tf.zeros([0], tf.int64), tf.zeros([0], tf.int64))  # a table not looked up

  def draw(seed):
    return select_rows_of_tables(table_pairs, sizes, tf.constant(3, tf.int64), 1.0, 1.0, 0.4, seed)

  graph = tf.function(draw)(seed)
  compiled = tf.function(draw, jit_compile=True)(seed)
  for a, b in zip(graph, compiled):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_a_row_outside_its_table_is_refused():
  bad = pairs()
  bad[1] = (bad[1][0], tf.constant([0, 1, 2, 5], tf.int64))  # table 1 has rows 0..4
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"outside \[0, 5\), the rows of its table"):
    tf.function(select_rows_of_tables)(bad, SIZES, tf.constant(BATCH, tf.int64), C1, TAU, STD,
                                       tf.constant([1, 2], tf.int64))


def test_tables_and_their_pairs_must_match():
  with pytest.raises(ValueError, match="pairs of each of its 3 tables, got 2"):
    select_rows_of_tables(pairs()[:2], SIZES, tf.constant(BATCH, tf.int64), C1, TAU, STD,
                          tf.constant([1, 2], tf.int64))


def _stacked_selection(dense, sizes=SIZES, lookups=LOOKUPS, jit_compile=False):
  """``select_stacked_rows`` of ``lookups`` on ``sizes`` with the tables ``dense`` flags."""
  stacked = StackedTables(sizes, [1] * len(sizes))
  kept = [lookups[t] for t in range(len(sizes))]
  example = tf.constant([e for table in kept for e, _ in table], tf.int64)
  row = stacked.stack_rows([tf.constant([r for _, r in table], tf.int64) for table in kept])

  def draw(seed):
    return table_selection.select_stacked_rows(example, row, stacked, tf.constant(BATCH, tf.int64),
                                               C1, TAU, STD, seed, dense=dense)
  return tf.function(draw, jit_compile=jit_compile), stacked


@pytest.mark.parametrize("dense", [(False, True, False), (True, False, True), (True, True, False)])
def test_a_dense_table_has_every_row_and_the_others_the_rows_they_have_alone(seed, dense):
  """The sparse tables' selection is, draw for draw, the one of a model without the dense tables
  (their lookups leave the contribution map and its joint clip); a dense table has all its rows
  and no false positive; compiled by XLA, the same rows in a static shape."""
  draw, stacked = _stacked_selection(dense)
  sparse = [t for t, d in enumerate(dense) if not d]
  alone, alone_stacked = _stacked_selection((), [SIZES[t] for t in sparse],
                                            [LOOKUPS[t] for t in sparse])
  compiled, _ = _stacked_selection(dense, jit_compile=True)
  for trial in range(20):
    selection, reference = draw(seed + trial), alone(seed + trial)
    parts = stacked.split(selection.rows)
    reference_parts = iter(alone_stacked.split(reference.rows))
    for t, (rows, _) in enumerate(parts):
      want = np.arange(SIZES[t]) if dense[t] else next(reference_parts)[0].numpy()
      np.testing.assert_array_equal(rows.numpy(), want)
    np.testing.assert_array_equal(selection.num_rows.numpy(),
                                  [len(rows) for rows, _ in parts])
    for field in ("num_true_positives", "num_dropped", "num_false_positives", "cut"):
      values = getattr(selection, field).numpy()
      assert not np.any(values[list(dense)])
      np.testing.assert_array_equal(values[sparse], getattr(reference, field).numpy())
    static = compiled(seed + trial)
    assert static.rows.shape == selection.rows.shape
    np.testing.assert_array_equal(static.rows.numpy(), selection.rows.numpy())


def test_every_table_dense_or_a_flag_per_table_missing_is_refused(seed):
  for dense, message in (((True, True, True), "must leave one table sparse"),
                         ((True, False), "must flag each of the 3 tables"),
                         ((False, False), "must flag each of the 3 tables")):
    draw, _ = _stacked_selection(dense)
    with pytest.raises(ValueError, match=message):
      draw(seed)
