"""DP training of Keras models: ``make_private`` and its parts."""

from sparse_dp.training.callbacks import BudgetExhaustedError, PrivacyCallback
from sparse_dp.training.config import DPConfig
from sparse_dp.training.dense_layers import UnsupportedLayerError
from sparse_dp.training.engine import PrivateTraining, make_private
from sparse_dp.training.sampling import poisson_batches
from sparse_dp.training.update_guard import UpdateOutsideDPStepError
from sparse_dp.training.weight_fingerprint import WeightsMovedOutsideDPError

__all__ = ["BudgetExhaustedError", "DPConfig", "PrivacyCallback", "PrivateTraining",
           "UnsupportedLayerError", "UpdateOutsideDPStepError", "WeightsMovedOutsideDPError",
           "make_private", "poisson_batches"]
