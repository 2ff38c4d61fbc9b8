"""Privacy accounting for DP-SGD, DP-FEST, DP-AdaFEST and DP-AdaFEST+."""

from sparse_dp.accounting.accountant import (
                                             AccountantKind,
                                             PrivacyAccountant,
                                             Truncation,
                                             gaussian_steps_event,
)
from sparse_dp.accounting.algorithms import (
                                             Algorithm,
                                             effective_noise_multiplier,
                                             split_noise_multiplier,
)
from sparse_dp.accounting.noise_calibration import (
                                             UnreachableTargetError,
                                             calibrate,
                                             calibrate_after,
                                             calibrate_noise_multiplier,
                                             release_noise_multiplier,
)
from sparse_dp.accounting.report import Epsilon, PrivacyReport
from sparse_dp.accounting.schedule import BatchPhase, BatchSchedule, steps_for_epochs
from sparse_dp.accounting.selection import TopKSelectionCost
from sparse_dp.accounting.spec import PrivacySpec

__all__ = [
    "AccountantKind", "Algorithm", "BatchPhase", "BatchSchedule", "Epsilon", "PrivacyAccountant",
    "PrivacyReport", "PrivacySpec", "TopKSelectionCost", "Truncation", "UnreachableTargetError",
    "calibrate", "calibrate_after", "calibrate_noise_multiplier", "effective_noise_multiplier",
    "gaussian_steps_event", "release_noise_multiplier", "split_noise_multiplier",
    "steps_for_epochs",
]
