"""``benchmarks/tpu_smoke.py`` off TPU (``--tpu none``): its steps run through ``TPUTrainer``
and the V1 API double, its table is what it trained, and two runs with its seeds give one
checksum (what ``--cores all`` against ``--cores 1`` compares on a TPU)."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).parents[3] / "benchmarks" / "tpu_smoke.py"


@pytest.fixture
def smoke(monkeypatch):
  spec = importlib.util.spec_from_file_location("tpu_smoke", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  monkeypatch.setattr(module, "EXAMPLES", 4_096)  # tiny: the script's logic, not its scale
  monkeypatch.setattr(module, "BATCH", 128)
  monkeypatch.setattr(module, "VOCABULARY", 500)
  return module


def test_the_smoke_test_trains_through_the_loop_and_reports_it(smoke, tmp_path, capsys):
  runs = []
  for name in ("a", "b"):
    assert smoke.main(["--tpu", "none", "--steps", "2", "--out", str(tmp_path / name)]) == 0
    runs.append(json.loads((tmp_path / name).read_text()))
  first, second = runs
  assert first["route"].startswith("TPUTrainer") and first["backend"] == "tpu-api-double"
  assert first["steps"] == 2 and first["replicas"] == 1 and first["weights_finite"]
  assert 0 < first["rows_changed"] < 500 and 0 < first["epsilon"] < 10
  assert first["table_checksum"] == second["table_checksum"]
  printed = capsys.readouterr().out
  assert "| table_checksum" in printed and f"{first['table_checksum']}" in printed
  with pytest.raises(SystemExit, match="--steps must be at least 1"):
    smoke.main(["--tpu", "none", "--steps", "0"])
