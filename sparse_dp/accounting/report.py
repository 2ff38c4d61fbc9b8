"""A privacy report: the numbers a run spent and a statement of what they mean."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from sparse_dp.accounting.accountant import PrivacyAccountant
from sparse_dp.accounting.algorithms import Algorithm
from sparse_dp.accounting.spec import PrivacySpec

_NAMES = {
    Algorithm.DPSGD: "DP-SGD",
    Algorithm.FEST: "DP-FEST",
    Algorithm.ADAFEST: "DP-AdaFEST",
    Algorithm.ADAFEST_PLUS: "DP-AdaFEST+",
}

POISSON_CAVEAT = (
    "This epsilon assumes Poisson sampling: each example joins each batch "
    "independently with probability q (Ghazi et al., NeurIPS 2023, §3.3). Batches cut from a "
    "shuffled dataset at a fixed size, as most input pipelines make them, are "
    "not covered by this proof; sample batches by Poisson sampling for a proved "
    "guarantee.")

NOT_POISSON = "NOT a proved epsilon: batches were not Poisson-sampled"

DEBUG_METRICS_CAVEAT = (
    "WARNING: debug_metrics was on: un-noised statistics of the private batches "
    "(training loss, compiled metrics, rows dropped, false positives, signal-to-noise "
    "ratio) were logged; they are NOT covered by this epsilon.")


FIXED_NOISE_SEED = ("the noise was drawn from a fixed noise_seed: the guarantee holds only "
                    "while that seed stays secret (anyone who knows it can subtract the noise)")


def epsilon_caveat(poisson_sampling: bool) -> str:
  """What to print right after an epsilon: nothing, or that it is not proved."""
  return "" if poisson_sampling else f" ({NOT_POISSON})"


class Epsilon(float):
  """An epsilon that carries what it does not cover, wherever it is printed.

  A ``float`` (arithmetic, comparisons and JSON give the number); ``str``, ``repr`` and
  ``format`` add the caveats, so a user who prints the number reads them with it.

  Args:
    value: the epsilon.
    caveats: why it is not proved, or what it assumes (empty: none).
  """

  caveats: tuple[str, ...]

  def __new__(cls, value: float, caveats=()) -> "Epsilon":
    epsilon = super().__new__(cls, value)
    epsilon.caveats = tuple(caveats)
    return epsilon

  @property
  def proved(self) -> bool:
    """Whether the number is a proved epsilon: every batch was Poisson-sampled."""
    return NOT_POISSON not in self.caveats

  def _with_caveats(self, number: str) -> str:
    return number + "".join(f" ({caveat})" for caveat in self.caveats)

  def __repr__(self) -> str:
    return self._with_caveats(float.__repr__(self))

  def __str__(self) -> str:
    return self._with_caveats(float.__repr__(self))

  def __format__(self, spec: str) -> str:
    # float.__format__ with an empty spec is str(self), which has the caveats already.
    return self._with_caveats(float.__format__(float(self), spec))


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
  """Epsilon of a :class:`PrivacySpec` at ``delta``, with its breakdown.

  Make one with :meth:`compute`.

  Attributes:
    spec: the run's algorithm, noise and batch schedule.
    epsilon: the total epsilon: pure spends plus the training steps, earlier runs'
      included.
    delta: the target delta.
    training_epsilon: the epsilon of the training steps alone.
    accountant: ``"pld"`` or ``"rdp"``.
    num_examples: ``N``, to state batch sizes and epochs; ``None`` leaves them out.
    poisson_sampling: whether every step was fed Poisson batches; if not, the epsilon
      is not proved, and the report says so.
    debug_metrics: whether un-noised statistics were logged, which no epsilon covers.
    earlier_steps: steps of earlier runs on the same model (a resumed or continued
      budget), composed into ``epsilon``.
    fixed_noise_seed: whether the noise came from a seed the user fixed.
    dense_tables: DP-AdaFEST's tables noised on every row, with no selection (the same
      epsilon: their rows are selected whatever the data).
  """

  spec: PrivacySpec
  epsilon: float
  delta: float
  training_epsilon: float
  accountant: str
  num_examples: Optional[int] = None
  poisson_sampling: bool = True
  debug_metrics: bool = False
  earlier_steps: int = 0
  fixed_noise_seed: bool = False
  dense_tables: tuple[str, ...] = ()

  @classmethod
  def compute(cls, spec: PrivacySpec, delta: float, accountant: str = "pld", *,
              num_examples: Optional[int] = None, poisson_sampling: bool = True,
              debug_metrics: bool = False, fixed_noise_seed: bool = False,
              ledger: Optional[PrivacyAccountant] = None,
              dense_tables: tuple[str, ...] = ()) -> "PrivacyReport":
    """The report of ``spec`` at ``delta``.

    Args:
      spec: the run's algorithm, noise and batch schedule.
      delta: the target delta.
      accountant: ``"pld"`` or ``"rdp"``; ignored when ``ledger`` is given.
      num_examples: ``N``, to state batch sizes and epochs.
      poisson_sampling: whether every step was fed Poisson batches.
      debug_metrics: whether un-noised statistics were logged.
      fixed_noise_seed: whether the noise came from a seed the user fixed.
      ledger: every spend, when earlier runs precede ``spec``'s; default: ``spec``'s
        own spends.
      dense_tables: DP-AdaFEST's tables noised on every row.

    Returns:
      The report, its epsilons computed by the accountant.

    Raises:
      ValueError: ``delta`` is not in ``(0, 1)``.
    """
    ledger = ledger if ledger is not None else spec.accountant(accountant)
    return cls(spec=spec, epsilon=ledger.get_epsilon(delta), delta=delta,
               training_epsilon=ledger.get_training_epsilon(delta),
               accountant=ledger.kind.value, num_examples=num_examples,
               poisson_sampling=poisson_sampling, debug_metrics=debug_metrics,
               earlier_steps=ledger.steps - spec.schedule.total_steps,
               fixed_noise_seed=fixed_noise_seed, dense_tables=tuple(sorted(dense_tables)))

  def to_dict(self) -> dict[str, Any]:
    """The report as JSON-ready numbers.

    Returns:
      The algorithm, epsilon, delta, steps, sampling rate(s), accountant, training
        epsilon and Poisson flag; then, where they apply, the debug flag, earlier
        steps, ``num_examples``, the noise (``sigma1``, ``sigma2`` and their
        ``effective_noise_multiplier``, or ``noise_multiplier``), ``selection_epsilon``
        and ``dense_tables``.
    """
    spec = self.spec
    rates = spec.schedule.sampling_rates
    out: dict[str, Any] = {
        "algorithm": spec.algorithm.value,
        "epsilon": self.epsilon,
        "delta": self.delta,
        "steps": spec.schedule.total_steps,
        "sampling_rate": rates[0] if len(rates) == 1 else list(rates),
        "accountant": self.accountant,
        "training_epsilon": self.training_epsilon,
        "poisson_sampling": self.poisson_sampling,
    }
    if self.debug_metrics:
      out["debug_metrics"] = True  # un-noised statistics were logged
    if self.fixed_noise_seed:
      out["fixed_noise_seed"] = True  # the guarantee needs the seed kept secret
    if self.earlier_steps:
      out["earlier_steps"] = self.earlier_steps
    if self.num_examples is not None:
      out["num_examples"] = self.num_examples
    if spec.algorithm.uses_contribution_map:
      out.update(sigma1=spec.sigma1, sigma2=spec.sigma2,
                 effective_noise_multiplier=spec.training_noise_multiplier)
    else:
      out["noise_multiplier"] = spec.noise_multiplier
    if spec.algorithm.uses_top_k_selection:
      out["selection_epsilon"] = spec.selection_epsilon
    if self.dense_tables:
      out["dense_tables"] = list(self.dense_tables)
    return out

  def statement(self) -> str:
    """A readable account, in the manner of TF Privacy's privacy statement.

    Returns:
      Lines of text: the algorithm and accountant, each phase's steps and sampling
        rate, the noise, the selection, the ``(epsilon, delta)`` guarantee, and the
        caveats (Poisson sampling, debug metrics, a fixed noise seed).
    """
    spec = self.spec
    steps = spec.schedule.total_steps
    lines = [f"{_NAMES[spec.algorithm]} with {self.accountant.upper()} accounting."]
    for phase in spec.schedule.phases:
      size = ""
      if self.num_examples:
        batch = phase.sampling_rate * self.num_examples
        epochs = phase.steps * phase.sampling_rate
        size = (f" (expected batch size {batch:,.0f} of {self.num_examples:,} "
                f"examples, {epochs:.3g} epoch{'' if epochs == 1 else 's'})")
      lines.append(f"  {phase.steps:,} steps at sampling rate q = "
                   f"{phase.sampling_rate:.6g}{size}")
    if spec.algorithm.uses_contribution_map:
      lines.append(
          f"  Noise: sigma1 = {spec.sigma1:.6g} on the contribution map, sigma2 = "
          f"{spec.sigma2:.6g} on the selected gradient rows; each step is one "
          f"Gaussian mechanism with noise multiplier {spec.training_noise_multiplier:.6g}.")
      if self.dense_tables:
        lines.append(f"  Dense tables, no selection and sigma2 on every row: "
                     f"{', '.join(self.dense_tables)}.")
    else:
      lines.append(f"  Noise multiplier: {spec.noise_multiplier:.6g}.")
    if spec.algorithm.uses_top_k_selection:
      lines.append(
          f"  Top-k bucket preselection: epsilon1 = {spec.selection_epsilon:.6g} "
          f"(pure DP), added by basic composition to the training epsilon "
          f"{self.training_epsilon:.6g}.")
    if self.earlier_steps:
      lines.append(f"  Continues {self.earlier_steps:,} steps of earlier runs on this model "
                   "(and their selections), composed into the epsilon below.")
    lines.append(
        f"The run of {steps + self.earlier_steps:,} steps satisfies ({_fmt(self.epsilon)}, "
        f"{self.delta:.3g})-DP for adding or removing one example"
        f"{epsilon_caveat(self.poisson_sampling)}.")
    lines.append(POISSON_CAVEAT if self.poisson_sampling else
                 "WARNING: batches were NOT Poisson-sampled; " + POISSON_CAVEAT)
    if self.debug_metrics:
      lines.append(DEBUG_METRICS_CAVEAT)
    if self.fixed_noise_seed:
      lines.append(f"WARNING: {FIXED_NOISE_SEED}.")
    return "\n".join(lines)


def _fmt(epsilon: float) -> str:
  return "inf" if math.isinf(epsilon) else f"{epsilon:.4g}"
