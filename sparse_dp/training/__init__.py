"""DP training of Keras models: ``make_private`` and its parts."""

from sparse_dp.training.config import DPConfig
from sparse_dp.training.dp_state.weight_fingerprint import WeightsMovedOutsideDPError
from sparse_dp.training.dp_step.dense_layers import UnsupportedLayerError
from sparse_dp.training.dp_step.update_guard import UpdateOutsideDPStepError
from sparse_dp.training.poisson.poisson_sampling import poisson_batches
from sparse_dp.training.wrappers.callbacks import BudgetExhaustedError, PrivacyCallback
from sparse_dp.training.wrappers.entry_point import make_private
from sparse_dp.training.wrappers.private_training import PrivateTraining, StepsRefusedError

__all__ = ["BudgetExhaustedError", "DPConfig", "PrivacyCallback", "PrivateTraining",
           "StepsRefusedError", "UnsupportedLayerError", "UpdateOutsideDPStepError",
           "WeightsMovedOutsideDPError", "make_private", "poisson_batches"]
