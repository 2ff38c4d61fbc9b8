"""Synthetic next-item sequences and secret-sharer canaries for Swing distillation.

The data are generated, never downloaded: users walk a first-order Markov chain over
``num_items`` items (``branching`` Zipf-popular successors each, Dirichlet(1) transition
probabilities); an example is the last ``history_length`` items of a walk and the next item.
*Privacy clue items* stand in for the paper's privacy clue words (Li et al., arXiv 2022,
§3.2 and App. C), drawn among the most popular items. *Canaries* follow the secret sharer
(Carlini et al. 2019; Li et al., arXiv 2022, §4.3): a random history, optionally ending in a
clue item, then a random secret item, repeated ``canary_repeats`` times in the teacher's data
only. See docs/commands/distill.md ("Swing's data").
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class NextItemExamples:
  """``histories`` int64 ``[N, L]`` (oldest first) and ``next_items`` int64 ``[N]``."""

  histories: np.ndarray
  next_items: np.ndarray

  def __len__(self) -> int:
    return len(self.next_items)

  def concatenate(self, other: "NextItemExamples") -> "NextItemExamples":
    return NextItemExamples(np.concatenate([self.histories, other.histories]),
                            np.concatenate([self.next_items, other.next_items]))

  def shuffled(self, rng: np.random.Generator) -> "NextItemExamples":
    order = rng.permutation(len(self))
    return NextItemExamples(self.histories[order], self.next_items[order])


@dataclasses.dataclass(frozen=True)
class MarkovItemChain:
  """A first-order Markov chain over items: ``successors[i]`` with ``probabilities[i]``."""

  successors: np.ndarray  # int64 [num_items, branching]
  probabilities: np.ndarray  # float64 [num_items, branching], rows sum to 1
  popularity: np.ndarray  # float64 [num_items], the Zipf weights successors were drawn by

  @classmethod
  def generate(cls, num_items: int, branching: int, zipf_exponent: float,
               rng: np.random.Generator) -> "MarkovItemChain":
    if num_items < 2 or not 1 <= branching < num_items:
      raise ValueError(f"need num_items >= 2 and 1 <= branching < num_items, got "
                       f"num_items={num_items}, branching={branching}")
    popularity = 1.0 / np.arange(1, num_items + 1) ** zipf_exponent
    popularity = popularity[rng.permutation(num_items)]
    popularity /= popularity.sum()
    successors = np.stack([rng.choice(num_items, branching, replace=False, p=popularity)
                           for _ in range(num_items)])
    probabilities = rng.dirichlet(np.ones(branching), size=num_items)
    return cls(successors.astype(np.int64), probabilities, popularity)

  @property
  def num_items(self) -> int:
    return len(self.successors)

  def step(self, items: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One transition of each chain in ``items`` (vectorised inverse-CDF sampling)."""
    cumulative = np.cumsum(self.probabilities[items], axis=1)
    choice = (rng.random((len(items), 1)) > cumulative).sum(axis=1)
    choice = np.minimum(choice, self.successors.shape[1] - 1)
    return self.successors[items, choice]

  def sample(self, num_examples: int, history_length: int,
             rng: np.random.Generator) -> NextItemExamples:
    """Independent walks started at popular items, burnt in for ``history_length`` steps."""
    items = rng.choice(self.num_items, num_examples, p=self.popularity)
    for _ in range(history_length):
      items = self.step(items, rng)
    walk = [items]
    for _ in range(history_length):
      walk.append(self.step(walk[-1], rng))
    walk = np.stack(walk, axis=1)
    return NextItemExamples(walk[:, :-1], walk[:, -1])

  def bayes_accuracy(self, examples: NextItemExamples, k: int) -> float:
    """Top-``k`` accuracy of the true transition probabilities (the best any model can do)."""
    order = np.argsort(-self.probabilities, axis=1)[:, :k]
    best = np.take_along_axis(self.successors, order, axis=1)[examples.histories[:, -1]]
    return float(np.mean(np.any(best == examples.next_items[:, None], axis=1)))

  def clue_items(self, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` privacy clue items drawn among the ``10 * count`` most popular items."""
    if not 0 <= count <= self.num_items // 10:
      raise ValueError(f"the number of clue items must be in [0, num_items / 10], got {count}")
    popular = np.argsort(-self.popularity)[:10 * count]
    return np.sort(rng.choice(popular, count, replace=False)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Canaries:
  """Canary histories and secrets; ``clued[j]`` says canary j's history ends in a clue item."""

  histories: np.ndarray  # int64 [M, L]
  secrets: np.ndarray  # int64 [M]
  clued: np.ndarray  # bool [M]

  @classmethod
  def generate(cls, count: int, history_length: int, num_items: int, clue_items: np.ndarray,
               rng: np.random.Generator) -> "Canaries":
    """Random histories and secrets; the first half end in a random clue item (if any).

    No other history position holds a clue item, so an unclued canary gets the
    constant temperature and a clued one the highest (distance 1).
    """
    histories = rng.integers(0, num_items, size=(count, history_length), dtype=np.int64)
    while np.isin(histories, clue_items).any():
      hits = np.isin(histories, clue_items)
      histories[hits] = rng.integers(0, num_items, size=int(hits.sum()))
    clued = np.zeros(count, bool)
    if len(clue_items):
      clued[:(count + 1) // 2] = True
      histories[clued, -1] = rng.choice(clue_items, int(clued.sum()))
    secrets = rng.integers(0, num_items, size=count, dtype=np.int64)
    return cls(histories, secrets, clued)

  def repeated(self, repeats: int) -> NextItemExamples:
    """Each canary ``repeats`` times, as training examples."""
    return NextItemExamples(np.repeat(self.histories, repeats, axis=0),
                            np.repeat(self.secrets, repeats))
