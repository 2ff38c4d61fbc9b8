"""The sparse DP mechanisms of DP-FEST and DP-AdaFEST, as TensorFlow functions.

Bottom up: ``randomness`` (seeds, Gaussian and exponential draws) and ``rows``
(padded, sorted row ids at fixed shapes); ``gradient_clipping`` (per-example row
gradients); ``selection`` (the contribution map and threshold, top-k preselection) and
``noise`` (dense and row-sparse Gaussian noise); ``platt_scaling``.

All are usable inside ``tf.function`` and take explicit ``[2]``-shaped seeds
(stateless random ops), so a step's noise is reproducible from its seed.
"""

from sparse_dp.mechanisms.gradient_clipping import (
    RowGradients,
    clip_factors,
    clipped_row_sum,
    clipped_rows,
    per_example_row_gradients,
    restrict_to_rows,
    squared_norms,
    zero_examples,
)
from sparse_dp.mechanisms.noise.dense_noise import NoisyTable, add_dense_noise
from sparse_dp.mechanisms.noise.row_noise import add_row_sparse_noise, row_sparse_noise, sum_on_rows
from sparse_dp.mechanisms.randomness.gaussian import standard_normal
from sparse_dp.mechanisms.randomness.seeds import fold_in, portable, split
from sparse_dp.mechanisms.rows.activations import Activations, activations, distinct_pairs
from sparse_dp.mechanisms.rows.padding import PAD, is_valid, padded_unique, safe_rows, sum_by_row
from sparse_dp.mechanisms.rows.remapping import BucketRemapping
from sparse_dp.mechanisms.rows.stacking import StackedTables
from sparse_dp.mechanisms.selection.contribution_map import (
    ContributionMap,
    clipped_contribution_maps,
    contribution_clip_weights,
    contribution_maps,
)
from sparse_dp.mechanisms.selection.row_selection import (
    RowSelection,
    bernoulli_positions,
    false_positive_capacity,
    false_positive_probability,
    padded_bernoulli_positions,
    sample_zero_rows,
    select_rows,
)
from sparse_dp.mechanisms.selection.table_selection import (
    StackedSelection,
    false_positive_rooms,
    select_rows_of_tables,
    select_stacked_rows,
)
from sparse_dp.mechanisms.selection.top_k import bucket_counts, dp_top_k, public_top_k

__all__ = [
    "PAD", "Activations", "BucketRemapping", "ContributionMap", "NoisyTable", "RowGradients",
    "RowSelection", "StackedSelection", "StackedTables",
    "activations", "add_dense_noise", "add_row_sparse_noise", "bernoulli_positions",
    "bucket_counts", "clip_factors", "clipped_contribution_maps", "clipped_row_sum",
    "clipped_rows",
    "contribution_clip_weights",
    "contribution_maps", "distinct_pairs", "dp_top_k", "false_positive_capacity", "fold_in",
    "false_positive_probability", "false_positive_rooms", "is_valid",
    "padded_bernoulli_positions", "padded_unique",
    "per_example_row_gradients", "portable", "public_top_k", "restrict_to_rows",
    "row_sparse_noise", "safe_rows", "sample_zero_rows", "select_rows", "select_rows_of_tables",
    "select_stacked_rows",
    "split", "squared_norms", "standard_normal", "sum_by_row", "sum_on_rows", "zero_examples",
]
