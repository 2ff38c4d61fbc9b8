"""Reading the batches of ``sparse-dp sample`` for training: one batch per step, in order.

:meth:`SampledBatches.open` reads the manifest and refuses a sample that does
not match it (a missing shard, a manifest its MAC does not sign, numbers that
do not describe one Poisson sample); each shard a run reads is checked
against its size and SHA-256 as it is opened. :meth:`SampledBatches.dataset` gives the
next ``steps`` unclaimed batches in step order, encoded exactly as
:class:`sparse_dp.data.criteo_stream.CriteoStream` encodes Criteo lines, each
batch at most once: the sample's own cursor skips every batch already handed
out (to a ``fit``, a second epoch, a ``repeat``, the separability probe), and
each call first claims its steps in the sample's folder
(:mod:`sparse_dp.jobs.sample.step_claims`), so no batch is ever trained on twice, by
this run or a later one, which would not be a Poisson sample. A run accounts
the batches it actually trained on. Under ``MultiWorkerMirroredStrategy`` the
chief alone claims, and every worker reads every batch and trains on its slice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
from typing import Optional

import tensorflow as tf

from sparse_dp.data.criteo_format import NUM_FIELDS
from sparse_dp.data.criteo_stream import CriteoStream
from sparse_dp.data.vocabulary import Vocabulary
from sparse_dp.distribute import roles, workers
from sparse_dp.jobs.sample import step_claims
from sparse_dp.jobs.sample.draws import SecretSeed
from sparse_dp.jobs.sample.manifest import MANIFEST_NAME, Manifest, file_digest

#: The refusal of a shard that is not the one the manifest describes (checked as it is read).
SHARD_CHANGED = "sparse-dp: a sample shard does not match the manifest"


def _fingerprint(mac: str, first: int, steps: int) -> int:
  """A signed 64-bit fingerprint of the steps ``first .. first + steps - 1`` of one sample."""
  digest = hashlib.sha256(f"{mac}:{first}:{steps}".encode()).digest()
  return int.from_bytes(digest[:8], "big", signed=True)


@dataclasses.dataclass
class SampledBatches:
  """A Poisson sample written by ``sparse-dp sample``, checked against its manifest."""

  folder: str
  manifest: Manifest
  vocabulary: Vocabulary  # encodes the lines, as CriteoStream does
  cursor: tf.Variable  # batches handed out so far

  @classmethod
  def open(cls, folder: str, vocabulary: Vocabulary, seed: SecretSeed) -> "SampledBatches":
    """The sample in ``folder``, drawn with ``seed`` (which checks its manifest's MAC)."""
    path = posixpath.join(folder, MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
      raise ValueError(f"--data {folder!r} has no {MANIFEST_NAME}: give the --out folder of "
                       "`sparse-dp sample` (a sample without its manifest cannot be accounted)")
    with tf.io.gfile.GFile(path) as handle:
      manifest = Manifest.from_json(handle.read(), path, seed)
    missing = [s.file for s in manifest.shards
               if not tf.io.gfile.exists(posixpath.join(folder, s.file))]
    if missing:
      raise ValueError(f"--data {folder!r}: {len(missing)} shard(s) of the manifest are missing "
                       f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                       "copy the whole sample folder, restore the shards with `sparse-dp sample "
                       "--reproduce`, or sample again")
    return cls(folder, manifest, vocabulary,
               tf.Variable(step_claims.steps_taken(folder), dtype=tf.int64, trainable=False,
                           name="sampled_batches_cursor"))

  @property
  def num_examples(self) -> int:
    return self.manifest.num_examples

  @property
  def batches_left(self) -> int:
    taken = max(int(self.cursor.numpy()), step_claims.steps_taken(self.folder))
    return max(0, self.manifest.steps - taken)

  def dataset(self, steps: int,
              strategy: Optional[tf.distribute.Strategy] = None) -> tf.data.Dataset:
    """The next ``steps`` unread batches, ``({"integers", "categorical"}, label)`` each,
    claimed for this run before any is read.

    Under a multi-worker ``strategy`` (``MultiWorkerMirroredStrategy``; every
    worker calls this at the same point) the workers train together on each
    step's one batch: the chief alone claims the steps, every worker starts at
    the chief's first step (the others' view of the claims may already hold the
    chief's), the workers check that they read the same sample for the same
    steps, and every worker reads every record and trains on its replicas'
    slices of each batch (:func:`sparse_dp.distribute.workers.sliced_per_replica`:
    a step's slices are exactly its batch; tf.data's default for files, file
    sharding, would put batches of other steps into one step).
    """
    first = self._claim(steps, strategy)
    if not workers.all_agree(strategy, _fingerprint(self.manifest.mac, first, steps)):
      raise ValueError(f"sparse-dp: the workers of this multi-worker job would train on "
                       f"different batches (--data {self.folder!r}, steps {first}.."
                       f"{first + steps - 1} here), and a step would not be one Poisson "
                       "sample: give every worker the same --data sample (a copy of the "
                       "folder is the same sample), --seed-file and --epochs")
    self.cursor.assign(first)
    end = first + steps
    shards = [s for s in self.manifest.shards if s.steps.start < end and s.steps.stop > first]
    stream = CriteoStream([posixpath.join(self.folder, s.file) for s in shards],
                          self.vocabulary)  # its encoding; the lines were checked when sampled
    cursor = self.cursor

    def unread(step, _):
      return tf.logical_and(step >= cursor, step < end)

    def batch(step, record):
      parsed = tf.io.parse_single_example(record, {
          "step": tf.io.FixedLenFeature([], tf.int64),
          "lines": tf.io.VarLenFeature(tf.string)})
      in_order = tf.debugging.assert_equal(parsed["step"], step,
                                           message="sample shard out of step order")
      fields = tf.strings.split(parsed["lines"].values, "\t")
      whole = tf.debugging.assert_equal(fields.row_lengths(), tf.cast(NUM_FIELDS, tf.int64),
                                        message="a sampled line without 40 fields")
      with tf.control_dependencies([in_order, whole, cursor.assign(step + 1)]):
        columns = tf.transpose(fields.to_tensor(default_value="", shape=[None, NUM_FIELDS]))
      features, label = stream.encode(columns)
      return ({"integers": tf.transpose(features["integers"]),
               "categorical": tf.transpose(features["categorical"])}, tf.transpose(label))

    return workers.sliced_per_replica(self._records(shards).filter(unread).map(batch).take(steps))

  def _claim(self, steps: int, strategy: Optional[tf.distribute.Strategy]) -> int:
    """The first of ``steps`` unread batches, claimed for this run (by the chief alone under
    a multi-worker ``strategy``, whose first step every worker takes)."""
    claimed, refusal = -1, None
    if not workers.is_multi_worker(strategy) or roles.is_chief():
      try:
        claimed = self._claim_here(steps)
      except ValueError as error:
        refusal = error  # raised once the other workers know, so that none waits for it
    first = workers.chiefs_value(strategy, claimed)
    if refusal is not None:
      raise refusal
    if first < 0:
      raise ValueError(f"sparse-dp: the chief of this multi-worker job could not claim "
                       f"batches of --data {self.folder!r} (its error says why), so no "
                       "worker trains on them")
    return first

  def _claim_here(self, steps: int) -> int:
    """Claims the next ``steps`` unread batches in the sample's folder; their first step."""
    left = self.batches_left
    first = self.manifest.steps - left
    if not 1 <= steps <= left:
      raise ValueError(f"{steps} steps asked of a sample with {left} unread batches of "
                       f"{self.manifest.steps} ({first} taken by this or earlier runs, see "
                       f"{posixpath.join(self.folder, step_claims.CLAIMS)}; a batch used twice is "
                       "not a Poisson sample): train for fewer steps, or sample again with "
                       "`sparse-dp sample` (a fresh salt: new batches)")
    step_claims.claim(self.folder, first, first + steps)
    return first

  def _records(self, shards: list) -> tf.data.Dataset:
    """``(step, record)`` of ``shards``, each shard checked against the manifest as it is opened.

    Only the shards of the steps a run reads are opened (a resumed run
    starts at its first unread step's shard), and each is hashed when its
    turn comes, not all before the first step: at Criteo-1TB scale a sample
    is about 1.3 TB of shards.
    """
    folder = self.folder
    paths = tf.constant([posixpath.join(folder, s.file) for s in shards])
    first_steps = tf.constant([s.first_step for s in shards], tf.int64)

    def check(index):
      shard = shards[int(index)]
      if file_digest(posixpath.join(folder, shard.file)) != (shard.bytes, shard.sha256):
        raise ValueError(f"{SHARD_CHANGED}: --data {folder!r}: {shard.file} (size or SHA-256): "
                         "the sample was changed after it was written; restore it with "
                         "`sparse-dp sample --reproduce`, or sample again")
      return index

    def records(index):
      checked = tf.py_function(check, [index], tf.int64)
      checked.set_shape([])
      return (tf.data.TFRecordDataset(tf.gather(paths, checked)).enumerate()
              .map(lambda offset, record: (tf.gather(first_steps, checked) + offset, record)))

    return tf.data.Dataset.range(len(shards)).flat_map(records)
