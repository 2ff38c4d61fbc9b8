"""Where each ``TF_CONFIG`` cluster task writes (``sparse-dp train``/``stream`` --out, --state)."""

import json
import pathlib

import pytest

from sparse_dp.distribute import roles

CLUSTER = {"worker": ["a:1", "b:1", "c:1"]}


def _config(monkeypatch, kind, index, cluster=CLUSTER):
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                              "task": {"type": kind, "index": index}}))


def test_only_the_chief_writes_the_folder_given_each_other_worker_its_own(monkeypatch):
  out = pathlib.Path("runs/pctr")
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert roles.output_folder(out) == out  # one process: its own chief
  _config(monkeypatch, "worker", 0)
  assert roles.output_folder(out) == out  # worker 0 of a cluster without a chief
  folders = set()
  for index in (1, 2):
    _config(monkeypatch, "worker", index)
    folders.add(roles.output_folder(out))
  assert folders == {out / "workers" / "worker_1", out / "workers" / "worker_2"}
  with_chief = {**CLUSTER, "chief": ["d:1"]}
  _config(monkeypatch, "chief", 0, with_chief)
  assert roles.output_folder(out) == out
  _config(monkeypatch, "worker", 0, with_chief)
  assert roles.output_folder(out) == out / "workers" / "worker_0"


def test_a_malformed_tf_config_is_refused_by_name(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", "{cluster}")
  with pytest.raises(ValueError, match="TF_CONFIG must be JSON with a task"):
    roles.output_folder(pathlib.Path("out"))
