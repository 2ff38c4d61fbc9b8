"""The accounting of a sample truncated to a maximum batch size (``sample --max-batch-size``)."""

import pytest

_TRUNCATION = pytest.importorskip("dp_accounting")
HAS_TRUNCATED_EVENT = hasattr(_TRUNCATION, "TruncatedSubsampledGaussianDpEvent")


@pytest.mark.skipif(not HAS_TRUNCATED_EVENT, reason="dp-accounting < 0.5.1 (the 3.11 stack)")
def test_truncated_epsilon_matches_untruncated_far_above_and_grows_below():
  from sparse_dp.accounting import PrivacyAccountant, Truncation
  num_examples, batch_size, steps, sigma = 100_000, 1_000, 10, 1.0
  q, delta = batch_size / num_examples, 1e-5
  plain = PrivacyAccountant().step(sigma, q, steps).get_epsilon(delta)
  far = PrivacyAccountant().step(sigma, q, steps, Truncation(num_examples, 2 * batch_size))
  assert far.get_epsilon(delta) == pytest.approx(plain, rel=1e-6)
  tight = PrivacyAccountant().step(sigma, q, steps, Truncation(num_examples, batch_size))
  assert tight.get_epsilon(delta) > plain * 1.01


@pytest.mark.skipif(HAS_TRUNCATED_EVENT, reason="dp-accounting >= 0.5.1 accounts truncation")
def test_truncation_is_refused_where_it_cannot_be_accounted():
  from sparse_dp.accounting import Truncation
  with pytest.raises(ValueError, match="dp-accounting >= 0.5.1"):
    Truncation(100_000, 2_000)
