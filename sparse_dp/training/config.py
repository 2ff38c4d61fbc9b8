"""Configuration of DP training: algorithm, clipping norms, noise, threshold."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional, Sequence, Union

from sparse_dp.accounting import Algorithm
from sparse_dp.accounting.adafest_defaults import adafest_settings
from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.mechanisms.selection.row_selection import false_positive_probability


@dataclasses.dataclass(frozen=True)
class DPConfig:
  """What :func:`sparse_dp.make_private` trains with.

  Attributes:
    algorithm: ``none``, ``dpsgd``, ``fest``, ``adafest`` or ``adafest+``.
    l2_norm_clip: ``C2``, the joint per-example gradient norm bound.
    noise_multiplier: ``sigma`` of ``dpsgd`` and ``fest``.
    sigma1: contribution-map noise multiplier of ``adafest`` / ``adafest+``.
    sigma2: gradient noise multiplier of ``adafest`` / ``adafest+``.
    target_epsilon: instead of the noise, calibrate it to this epsilon over
      the planned epochs (``sigma1 / sigma2 = sigma_ratio`` for AdaFEST).
    sigma_ratio: ``sigma1 / sigma2`` when calibrating AdaFEST. ``None`` (default):
      ``8 / threshold_sigmas`` (:mod:`sparse_dp.accounting.adafest_defaults`).
    contribution_clip: ``C1``, the contribution-vector norm bound.
    threshold_sigmas: the threshold ``tau`` in units of the contribution map's
      noise, ``tau = threshold_sigmas * sigma1 * C1``: a row nobody touched is then
      selected with probability ``Psi(threshold_sigmas)`` whatever noise the
      calibration picks (§3.2, App. B.2). ``None`` (default): the least value that
      lets at most ``0.01 B`` untouched rows through a step, at least 1
      (:func:`~sparse_dp.accounting.adafest_defaults.default_threshold_sigmas`).
      Ignored when ``threshold`` is given.
    threshold: ``tau`` in absolute units (contributions of examples), instead
      of ``threshold_sigmas``.
    selection_epsilon: ``epsilon1`` already spent on a DP top-k preselection
      of the tables' buckets (``fest``, ``adafest+``); charged by the accountant.
    delta: target delta; default ``1 / num_examples``.
    epsilon_budget: training stops before a step that would exceed it
      (default: ``target_epsilon`` when given).
    noise_seed: ``None`` (default): a fresh secret seed from the operating
      system for the noise and the Poisson sampling. An integer makes runs
      reproducible, but the noise is then only as secret as that integer:
      anyone who knows it can regenerate and subtract the noise, so never use
      a fixed seed for a release. Each step uses ``fold_in(seed, step)``.
    microbatch_size: process each (logical) batch in micro-batches of this
      many examples and add the noise once (gradient accumulation): memory
      then depends on the micro-batch, not the batch. ``None``: one pass.
    debug_metrics: also log un-noised statistics of each batch (its training
      loss and compiled metrics, ``rows_dropped``, ``false_positive_rows``,
      ``gradient_snr``). They are functions of the private batch without
      noise, so they are NOT covered by the epsilon; the report says so.
      Default ``False``: the logs hold only what is DP or public.
    dense_tables: ``adafest`` and ``adafest+`` only: the names of the ``Embedding`` layers
      whose tables take no part in the selection and get noise on every row, as DP-SGD's
      (:meth:`dense_table_names`), or ``"auto"``: every table of at most the expected batch
      size of rows. The other tables keep the sparse mechanisms, and the epsilon is the
      same: a dense table's rows are selected whatever the data. ``dpsgd`` and ``fest``
      noise every table's rows already.

  Raises:
    ValueError: an unknown ``algorithm``; a clipping norm or threshold that is not a
      finite number > 0; a ``microbatch_size`` that is not an integer >= 1; or a private
      algorithm given neither its noise nor ``target_epsilon``.
  """

  algorithm: str = "adafest"
  l2_norm_clip: float = 1.0
  noise_multiplier: Optional[float] = None
  sigma1: Optional[float] = None
  sigma2: Optional[float] = None
  target_epsilon: Optional[float] = None
  sigma_ratio: Optional[float] = None
  contribution_clip: float = 1.0
  threshold_sigmas: Optional[float] = None
  threshold: Optional[float] = None
  selection_epsilon: float = 0.0
  delta: Optional[float] = None
  epsilon_budget: Optional[float] = None
  noise_seed: Optional[int] = None
  microbatch_size: Optional[int] = None
  debug_metrics: bool = False
  dense_tables: Union[str, Sequence[str]] = ()

  def __post_init__(self):
    algorithm = Algorithm.parse(self.algorithm)
    object.__setattr__(self, "algorithm", algorithm.value)
    object.__setattr__(self, "dense_tables", _checked_dense_tables(self.dense_tables))
    check_positive("l2_norm_clip (C2)", self.l2_norm_clip)
    check_positive("contribution_clip (C1)", self.contribution_clip)
    for name in ("threshold_sigmas", "sigma_ratio"):
      if getattr(self, name) is not None:
        check_positive(name, getattr(self, name))
    if self.threshold is not None:
      check_positive("threshold (tau)", self.threshold)
    if self.microbatch_size is not None and (
        not isinstance(self.microbatch_size, int) or self.microbatch_size < 1):
      raise ValueError(f"microbatch_size must be an integer >= 1, got {self.microbatch_size!r}")
    if algorithm.is_private and self.target_epsilon is None:
      needed = (("sigma1", "sigma2") if algorithm.uses_contribution_map
                else ("noise_multiplier",))
      missing = [n for n in needed if getattr(self, n) is None]
      if missing:
        raise ValueError(f"algorithm '{algorithm.value}' needs {' and '.join(missing)} "
                         "or target_epsilon")

  @property
  def kind(self) -> Algorithm:
    """``algorithm`` as an :class:`~sparse_dp.accounting.Algorithm`."""
    return Algorithm(self.algorithm)

  def threshold_for(self, sigma1: float) -> float:
    """The AdaFEST threshold ``tau`` at contribution-map noise ``sigma1`` (§3.2).

    Args:
      sigma1: the noise multiplier of the contribution map.

    Returns:
      ``threshold`` if given, else ``threshold_sigmas * sigma1 * C1``.

    Raises:
      ValueError: neither ``threshold`` nor ``threshold_sigmas`` is set (see
        :meth:`with_adafest_defaults`).
    """
    if self.threshold is not None:
      return self.threshold
    if self.threshold_sigmas is None:
      raise ValueError("threshold_sigmas is None: DPConfig.with_adafest_defaults(...) sets it "
                       "from the tables' sizes and the batch size")
    return self.threshold_sigmas * sigma1 * self.contribution_clip

  def with_adafest_defaults(self, vocabulary_sizes: Sequence[int],
                            expected_batch_size: float) -> DPConfig:
    """This config with the rule's ``threshold_sigmas`` and ``sigma_ratio`` where unset.

    Args:
      vocabulary_sizes: the rows of each table DP-AdaFEST selects from (not the dense ones).
      expected_batch_size: ``B``.

    Returns:
      ``self`` for an algorithm without a contribution map, else a copy with the values the
      run uses (:func:`~sparse_dp.accounting.adafest_defaults.adafest_settings`):
      ``threshold_sigmas`` ``None`` under an absolute ``threshold``, and ``sigma_ratio``
      ``sigma1 / sigma2`` where those are given without ``target_epsilon``.
    """
    if not self.kind.uses_contribution_map:
      return self
    settings = adafest_settings(vocabulary_sizes, expected_batch_size,
                                self.threshold_sigmas, self.sigma_ratio)
    ratio = (self.sigma1 / self.sigma2 if self.target_epsilon is None
             else settings.sigma_ratio)
    return dataclasses.replace(
        self, sigma_ratio=ratio,
        threshold_sigmas=None if self.threshold is not None else settings.threshold_sigmas)

  def dense_table_names(self, vocabulary_sizes: Sequence[tuple[str, int]],
                        expected_batch_size: float) -> frozenset:
    """The tables DP-AdaFEST noises on every row: :func:`dense_table_names` of this config's
    ``dense_tables`` and algorithm.

    Args:
      vocabulary_sizes: the model's ``Embedding`` layers, ``(name, rows V_t)`` each.
      expected_batch_size: ``B = q N``.

    Returns:
      The names of the dense tables (a frozenset); empty for an algorithm without a selection.

    Raises:
      ValueError: as :func:`dense_table_names` raises it.
    """
    return dense_table_names(self.dense_tables, self.kind, vocabulary_sizes, expected_batch_size)


def dense_table_names(dense_tables: Union[str, Sequence[str]], algorithm: Algorithm,
                      vocabulary_sizes: Sequence[tuple[str, int]],
                      expected_batch_size: float) -> frozenset:
  """The tables DP-AdaFEST noises on every row (``DPConfig.dense_tables`` resolved for a model).

  ``"auto"`` takes every table with ``V_t <= B``: one batch can touch all its rows, so the
  sparse update saves at most a constant factor there, and dense noise trains the rows
  that too few examples touch to pass the threshold. See docs/dense_tables.md.

  Args:
    dense_tables: ``"auto"`` or layer names, as ``DPConfig`` checked them.
    algorithm: the algorithm; only one with a contribution map has dense tables.
    vocabulary_sizes: the model's ``Embedding`` layers, ``(name, rows V_t)`` each.
    expected_batch_size: ``B = q N``.

  Returns:
    The names of the dense tables; empty for an algorithm without a selection.

  Raises:
    ValueError: a name that is not one of the model's ``Embedding`` layers; two of its
      layers of one name (a name would not say which table is dense); or every table
      dense (that is DP-SGD, which gives all the budget to the gradient's noise).
  """
  if not dense_tables:
    return frozenset()
  tables = [name for name, _ in vocabulary_sizes]
  repeated = sorted({name for name in tables if tables.count(name) > 1})
  if repeated:
    raise ValueError(f"dense_tables picks tables by layer name, and the model has several "
                     f"Embedding layers named {repeated}: give each a name of its own "
                     "(Embedding(..., name=...))")
  unknown = [] if dense_tables == "auto" else sorted(set(dense_tables) - set(tables))
  if unknown:
    raise ValueError(f"dense_tables names {unknown}, not Embedding layers of the model: "
                     f"its tables are {sorted(tables)}")
  if not algorithm.uses_contribution_map:
    return frozenset()
  names = ({name for name, rows in vocabulary_sizes if rows <= expected_batch_size}
           if dense_tables == "auto" else set(dense_tables))
  if names and names == set(tables):
    raise ValueError(
        f"dense_tables={dense_tables!r} makes all {len(names)} tables of the model "
        "dense, leaving DP-AdaFEST nothing to select while its contribution "
        "map still takes a share of the budget: use algorithm 'dpsgd' ('fest' on preselected "
        "buckets), or leave a table sparse")
  return frozenset(names)


def _checked_dense_tables(dense_tables) -> Union[str, tuple]:
  """``"auto"`` or a tuple of layer names; refuses anything else, naming the fix."""
  if dense_tables is None:
    return ()
  if isinstance(dense_tables, str):
    if dense_tables != "auto":
      raise ValueError(f"dense_tables must be 'auto' or a list of Embedding layer names, got "
                       f"{dense_tables!r}: for one table write dense_tables=[{dense_tables!r}]")
    return dense_tables
  if not isinstance(dense_tables, (list, tuple, set, frozenset)) or not all(
      isinstance(name, str) for name in dense_tables):
    raise ValueError(f"dense_tables must be 'auto' or a list of Embedding layer names, got "
                     f"{dense_tables!r}")
  return tuple(dense_tables)


def warn_if_threshold_densifies(vocabulary_sizes: Sequence[int], threshold: float,
                                noise_stddev: float, expected_batch_size: float) -> float:
  """Warns when ``tau`` lets more untouched rows through than a batch touches.

  A row no example touched passes the threshold with probability
  ``p = Psi(tau / (sigma1 C1))`` (App. B.2), so a step updates about
  ``sum_t V_t p`` false-positive rows. A batch touches at most about ``B`` rows
  per table (one id per example; more for multi-valent features); when the
  false positives exceed that, noise dominates the update and its size grows
  with the vocabulary, not the batch. Returns the expected false positives.
  """
  expected = sum(vocabulary_sizes) * false_positive_probability(threshold, noise_stddev)
  touched = expected_batch_size * len(vocabulary_sizes)
  if expected > touched:
    warnings.warn(
        f"sparse-dp: threshold tau = {threshold:.4g} is only {threshold / noise_stddev:.3g} "
        f"times the contribution map's noise (sigma1 C1 = {noise_stddev:.4g}): about "
        f"{expected:,.0f} untouched rows per step pass it, more than the ~{touched:,.0f} rows a "
        "batch touches, so the update is mostly noise and not sparse; raise "
        "DPConfig(threshold_sigmas=...), or leave it and threshold unset for the rule's "
        "(docs/adafest_defaults.md)", stacklevel=3)
  return expected
