"""The fields every ``sparse-dp distill`` report shares: sizes, compression, speed-up.

As the seeds report them (RONA Table 3, Swing §6): the compression ratio is the
teacher's parameter count over the student's; the speed-up is the student's
measured examples per second over the teacher's on the same inputs and batch
size (median of repeated timed passes, after one untimed warm-up pass that
traces the function).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras


def parameter_count(model: keras.Model) -> int:
  """Number of scalar weights of ``model``, trainable or not, but not sparse-dp's
  ``dp_record`` bookkeeping (what private training spent; not a parameter)."""
  return int(sum(np.prod(w.shape) for w in model.weights if "dp_record" not in w.name))


def examples_per_second(model: keras.Model, inputs: Any, batch_size: int = 1024,
                        repeats: int = 5) -> float:
  """Median throughput of ``model`` predicting ``inputs`` (a tensor or dict of tensors)."""
  dataset = tf.data.Dataset.from_tensor_slices(inputs).batch(batch_size).cache()
  predict = tf.function(lambda batch: model(batch, training=False))
  for batch in dataset:  # warm-up: trace and cache
    predict(batch)
  timings = []
  for _ in range(repeats):
    start = time.perf_counter()
    for batch in dataset:
      predict(batch)
    timings.append(time.perf_counter() - start)
  return num_examples(inputs) / statistics.median(timings)


def size_and_speed(teacher: keras.Model, student: keras.Model, inputs: Any,
                   batch_size: int = 1024) -> dict:
  """Parameter counts, compression ratio and measured speed-up of ``student`` over ``teacher``."""
  teacher_params, student_params = parameter_count(teacher), parameter_count(student)
  teacher_speed = examples_per_second(teacher, inputs, batch_size)
  student_speed = examples_per_second(student, inputs, batch_size)
  return {"teacher_parameters": teacher_params, "student_parameters": student_params,
          "compression_ratio": teacher_params / student_params,
          "teacher_examples_per_second": teacher_speed,
          "student_examples_per_second": student_speed,
          "speedup": student_speed / teacher_speed,
          "speed_measured_on": f"{num_examples(inputs)} held-out examples, batch {batch_size}, "
                               "median of 5 passes, this machine's CPU/GPU"}


def num_examples(inputs: Any) -> int:
  return int(tf.nest.flatten(inputs)[0].shape[0])
