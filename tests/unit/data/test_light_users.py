"""The synthetic data's light users (``SyntheticCriteo(light_users=s)``): a user feature whose
examples come a share ``1 - s`` from the top 5% of its users and ``s`` evenly from the rest."""

import hashlib

import numpy as np
import pytest
from scipy import stats

from sparse_dp.data.synthetic import USER_FEATURE, SyntheticCriteo

from support.stacks import ALPHA

COUNT = 40_000


# SHA-256 of examples(1, 500) at scale 0.1 (buckets, integer_missing, integers, labels) drawn
# by the generator before light users existed (5837642), on both stacks.
BEFORE_LIGHT_USERS = "366b2c093d067a6fbdca76df696c078638b7c8e4a917402d53067afd3a4b50b8"


def test_off_by_default_the_data_is_the_generator_s_before_light_users_to_the_bit():
  data = SyntheticCriteo(scale=0.1, light_users=0.0).examples(1, 500)
  digest = hashlib.sha256()
  for key in ("buckets", "integer_missing", "integers", "labels"):
    digest.update(key.encode())
    digest.update(np.ascontiguousarray(data[key], dtype=np.int64).tobytes())
  assert digest.hexdigest() == BEFORE_LIGHT_USERS


@pytest.mark.parametrize("share", [0.3, 0.7])
def test_light_users_give_their_share_of_the_examples_evenly(share):
  dataset = SyntheticCriteo(light_users=share)
  size = dataset.vocabulary_sizes[USER_FEATURE]
  heavy = int(np.ceil(0.05 * size))
  users = dataset.examples(0, COUNT)["buckets"][:, USER_FEATURE]
  users = users[users >= 0]
  ranks = np.argsort(dataset._ranking(USER_FEATURE, 0))[users]  # day 0: no drift yet
  light = ranks >= heavy
  # The light users' share (binomial z-test), spread evenly over them (chi-square).
  assert abs(light.mean() - share) / np.sqrt(share * (1 - share) / len(light)) < stats.norm.isf(
      ALPHA / 2)
  counts = np.bincount(ranks[light] - heavy, minlength=size - heavy)
  assert stats.chisquare(counts).pvalue > ALPHA
  # A heavy user has about (1 - share) / heavy / (share / light users) times a light one's.
  assert np.bincount(ranks[~light], minlength=heavy).mean() > 5 * counts.mean()


def test_a_share_outside_zero_to_one_is_refused():
  for share in (-0.1, 1.0):
    with pytest.raises(ValueError, match=r"light_users must be in \[0, 1\)"):
      SyntheticCriteo(light_users=share)
