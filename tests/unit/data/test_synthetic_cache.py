"""Synthetic days drawn once and reused (``sparse_dp.data.synthetic_cache``)."""

import gzip

import pytest

from sparse_dp.data import synthetic_cache
from sparse_dp.data.synthetic import SyntheticCriteo


@pytest.fixture
def cache(tmp_path, monkeypatch):
  folder = tmp_path / "cache"
  monkeypatch.setenv(synthetic_cache.CACHE_ENV, str(folder))
  return folder


def _lines(path):
  with gzip.open(path, "rt") as lines:
    return lines.read()


def test_a_draw_is_reused_and_equals_a_fresh_one(cache, tmp_path):
  dataset = SyntheticCriteo(scale=0.001, seed=3)
  first, reused = synthetic_cache.write_day(dataset, tmp_path / "a.gz", 1, 50)
  assert not reused
  second, reused = synthetic_cache.write_day(dataset, tmp_path / "b.gz", 1, 50)
  assert reused
  fresh = dataset.write_day(tmp_path / "fresh.gz", 1, 50)
  assert _lines(first) == _lines(second) == _lines(fresh)
  assert len(list((cache / "synthetic").iterdir())) == 1


def test_every_input_of_the_draw_is_in_its_key():
  base = synthetic_cache.draw_key(SyntheticCriteo(scale=0.001, seed=3), 1, 50)
  others = [synthetic_cache.draw_key(SyntheticCriteo(scale=0.002, seed=3), 1, 50),
            synthetic_cache.draw_key(SyntheticCriteo(scale=0.001, seed=4), 1, 50),
            synthetic_cache.draw_key(SyntheticCriteo(scale=0.001, seed=3, drift=0.3), 1, 50),
            synthetic_cache.draw_key(SyntheticCriteo(scale=0.001, seed=3), 2, 50),
            synthetic_cache.draw_key(SyntheticCriteo(scale=0.001, seed=3), 1, 51),
            synthetic_cache.draw_key(SyntheticCriteo(scale=0.001, seed=3, light_users=0.5),
                                     1, 50)]
  assert len({base, *others}) == 7


def test_a_stopped_draw_leaves_no_entry(cache, tmp_path, monkeypatch):
  dataset = SyntheticCriteo(scale=0.001, seed=3)

  def stopped(self, path, day, count):
    path.write_text("half a day")
    raise KeyboardInterrupt

  monkeypatch.setattr(SyntheticCriteo, "write_day", stopped)
  with pytest.raises(KeyboardInterrupt):
    synthetic_cache.write_day(dataset, tmp_path / "a.gz", 1, 50)
  assert not list((cache / "synthetic").glob("*.gz"))
  assert not (tmp_path / "a.gz").exists()
