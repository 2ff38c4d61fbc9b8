"""Ratings shaped like MovieLens 100K (the TFRS walk-through's data)."""

import numpy as np
import pytest

from sparse_dp.data.synthetic_ratings import SyntheticRatings


def test_the_draw_has_movielens_100k_s_shape_and_long_tailed_users():
  ratings = SyntheticRatings().draw()
  users, per_user = np.unique(ratings["user_id"], return_counts=True)
  pairs = set(zip(ratings["user_id"], ratings["movie_title"]))
  assert len(ratings["user_rating"]) == len(pairs) == 100_000  # no movie rated twice by a user
  assert len(users) == 943 and per_user.min() >= 20
  assert per_user.max() > 8 * np.median(per_user)  # a few heavy users, many light ones
  assert set(np.unique(ratings["user_rating"])) == {1.0, 2.0, 3.0, 4.0, 5.0}
  assert 0.9 < ratings["user_rating"].std() < 1.3
  assert set(ratings["movie_title"]) <= set(SyntheticRatings().movie_titles())


def test_a_seed_gives_one_draw():
  first, again = SyntheticRatings(ratings=30_000, seed=3).draw(), SyntheticRatings(
      ratings=30_000, seed=3).draw()
  other = SyntheticRatings(ratings=30_000, seed=4).draw()
  assert all(np.array_equal(first[k], again[k]) for k in first)
  assert not np.array_equal(first["user_rating"], other["user_rating"])


@pytest.mark.parametrize("settings, message", [
    ({"ratings": 100}, r"= \[18860, 1586126\], got 100"),
    ({"movies": 5}, "movies >= 20"),
])
def test_impossible_sizes_are_refused(settings, message):
  with pytest.raises(ValueError, match=message):
    SyntheticRatings(**settings)
