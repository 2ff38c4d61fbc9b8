"""Movie ratings shaped like MovieLens 100K, drawn from a planted model (no download).

The TFRS ranking walk-through (docs/tfrs_ranking.md) trains on these: 943 users, 1,682
movies and 100,000 ratings by default, as in MovieLens 100K (Harper & Konstan, "The
MovieLens Datasets: History and Context", ACM TiiS 2015). Each user rates at least 20
movies; the other ratings go to users in proportion to a log-normal activity, so a few
heavy users rate hundreds and most rate a few dozen, and each user's movies are drawn
without repeats in proportion to a Zipf popularity. A rating is

    clip(round(3.53 + b_u + b_m + <p_u, q_m> + e), 1, 5)

with user and movie biases ``b``, 4-dimensional tastes ``p``, ``q`` and noise ``e``: its
spread (about 1.1) is MovieLens's, and a constant predictor's RMSE is about that.
"""

from __future__ import annotations

import dataclasses

import numpy as np

MIN_RATINGS_PER_USER = 20


@dataclasses.dataclass(frozen=True)
class SyntheticRatings:
  """A draw of ``ratings`` ratings by ``users`` users of ``movies`` movies.

  Attributes:
    users: users, each rating at least 20 movies.
    movies: movies.
    ratings: ratings in all, at most ``users * movies``.
    seed: the draw's seed.
  """

  users: int = 943
  movies: int = 1_682
  ratings: int = 100_000
  seed: int = 0

  def __post_init__(self):
    if self.users < 1 or self.movies < MIN_RATINGS_PER_USER:
      raise ValueError(f"need users >= 1 and movies >= {MIN_RATINGS_PER_USER}, got "
                       f"users={self.users}, movies={self.movies}")
    if not MIN_RATINGS_PER_USER * self.users <= self.ratings <= self.users * self.movies:
      raise ValueError(f"ratings must be in [{MIN_RATINGS_PER_USER} x users, users x movies] = "
                       f"[{MIN_RATINGS_PER_USER * self.users}, {self.users * self.movies}], "
                       f"got {self.ratings}")

  def user_ids(self) -> np.ndarray:
    """Every user's id, ``b"1"`` to ``b"943"``: the public list a vocabulary comes from."""
    return np.array([str(u + 1).encode() for u in range(self.users)])

  def movie_titles(self) -> np.ndarray:
    """Every movie's title, ``b"Movie 1"`` on: the public catalogue."""
    return np.array([f"Movie {m + 1}".encode() for m in range(self.movies)])

  def draw(self) -> dict[str, np.ndarray]:
    """The ratings, in a random order, as the TFRS tutorial's features.

    Returns:
      ``{"user_id": bytes [R], "movie_title": bytes [R], "user_rating": float32 [R]}``.
    """
    rng = np.random.default_rng(self.seed)
    activity = rng.lognormal(0.0, 1.0, self.users)
    counts = MIN_RATINGS_PER_USER + _apportion(self.ratings - MIN_RATINGS_PER_USER * self.users,
                                               activity, self.movies - MIN_RATINGS_PER_USER)
    popularity = 1.0 / np.arange(1, self.movies + 1)
    popularity = rng.permutation(popularity / popularity.sum())
    user = np.repeat(np.arange(self.users), counts)
    movie = np.concatenate([rng.choice(self.movies, c, replace=False, p=popularity)
                            for c in counts])
    taste_u, taste_m = rng.normal(0, 0.35, (self.users, 4)), rng.normal(0, 0.35, (self.movies, 4))
    score = (3.53 + rng.normal(0, 0.45, self.users)[user] + rng.normal(0, 0.55, self.movies)[movie]
             + np.einsum("ij,ij->i", taste_u[user], taste_m[movie])
             + rng.normal(0, 0.85, len(user)))
    order = rng.permutation(len(user))
    return {"user_id": self.user_ids()[user[order]],
            "movie_title": self.movie_titles()[movie[order]],
            "user_rating": np.clip(np.round(score[order]), 1, 5).astype(np.float32)}


def _apportion(total: int, weights: np.ndarray, cap: int) -> np.ndarray:
  """``total`` split in proportion to ``weights``, none above ``cap`` (the excess goes to
  the others in turn)."""
  counts = np.zeros(len(weights), np.int64)
  while total > 0:
    room = cap - counts
    share = np.where(room > 0, weights, 0.0)
    add = np.minimum(np.floor(total * share / share.sum()).astype(np.int64), room)
    if add.sum() == 0:  # the remainder: one each to the heaviest with room
      add[np.argsort(-share)[:total]] = 1
    counts += add
    total -= int(add.sum())
  return counts
