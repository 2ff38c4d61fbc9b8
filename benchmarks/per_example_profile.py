"""Where one setting's DP step spends its time: TensorFlow ops by type and by name.

Runs one setting of ``per_example_cost.py`` in this process (its ``sparse_dp`` is
the first on ``PYTHONPATH``), warms the train function up, traces ``--steps``
steps with ``tf.profiler.experimental`` and sums the TensorFlow op events of the
trace (wall time of each op on its thread; ops run in parallel, so the sums can
exceed the step time). Prints one JSON object: seconds per op type and the
costliest op names, per step.

  PYTHONPATH=TREE python benchmarks/per_example_profile.py table4-adafest-1e6
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import per_example_cost

_WARMUP_STEPS = 2


def main(argv=None) -> int:
  settings = per_example_cost._settings()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("setting", choices=sorted(settings))
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--top", type=int, default=15, help="op names listed")
  args = parser.parse_args(argv)
  import tensorflow as tf

  kind, worker_settings = settings[args.setting]
  train, iterator = _train_function(kind, worker_settings, args.steps)
  for _ in range(_WARMUP_STEPS):
    train(iterator)
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for _ in range(args.steps):
      {k: v.numpy() for k, v in train(iterator).items()}
    seconds = (time.perf_counter() - start) / args.steps
    tf.profiler.experimental.stop()
    by_type, by_name = _op_seconds(next(pathlib.Path(logdir).rglob("*.xplane.pb")))
  def per_step(table, top):
    return {k: round(v / args.steps, 4) for k, v in table.most_common(top)}
  import sparse_dp
  print(json.dumps({"setting": args.setting, "sparse_dp": sparse_dp.__file__,
                    "seconds_per_step_traced": seconds,
                    "op_seconds_per_step": round(sum(by_type.values()) / args.steps, 4),
                    "by_type": per_step(by_type, 20), "by_name": per_step(by_name, args.top)},
                   indent=1))
  return 0


def _train_function(kind: str, settings: dict, steps: int):
  """The setting's compiled train function and its batches, as the cost workers build them."""
  import numpy as np
  import tensorflow as tf
  if kind == "pctr":
    model, _, iterator = per_example_cost.pctr_training(settings["algorithm"],
                                                        _WARMUP_STEPS + steps)
    return model.make_train_function(), iterator
  from sparse_dp.jobs.bench import step_time_benchmark
  rng = np.random.default_rng(0)
  shape = (_WARMUP_STEPS + steps, settings["batch_size"])
  ids = (rng.zipf(1.1, shape) % settings["vocab"]).astype("int64")
  labels = rng.integers(0, 2, shape + (1,)).astype("float32")
  model, _ = step_time_benchmark._build(settings, tf)
  iterator = iter(tf.data.Dataset.from_tensor_slices((ids, labels)).repeat())
  return model.make_train_function(), iterator


def _op_seconds(path: pathlib.Path):
  """Seconds of the trace's TensorFlow op events (``name:Type``), by type and by name."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  space = xplane_pb2.XSpace()
  space.ParseFromString(path.read_bytes())
  by_type, by_name = collections.Counter(), collections.Counter()
  for plane in space.planes:
    if not plane.name.startswith("/host:"):
      continue
    for line in plane.lines:
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        op, _, op_type = name.rpartition(":")
        if not op or not op_type[:1].isupper() or "::" in name:
          continue
        by_type[op_type] += event.duration_ps * 1e-12
        by_name[name] += event.duration_ps * 1e-12
  return by_type, by_name


if __name__ == "__main__":
  sys.exit(main())
