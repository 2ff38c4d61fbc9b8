"""Private distillation of a large model into a compact student.

``sparse-dp distill --method M ... --out FILE.json`` trains a teacher, a compact
student from it, and writes one JSON object: sizes, compression ratio, measured
speed-up, teacher and student quality on held-out data, and the epsilon with
what it covers. Methods (:mod:`sparse_dp.jobs.distill.distill_command`):

* ``dp-teacher``: a DP-AdaFEST teacher distilled on public or synthetic inputs;
  the student is post-processing and inherits the teacher's epsilon.
* ``rona``: RONA (Wang et al., AAAI 2019): a non-private teacher answers clipped,
  Gaussian-noised batch queries chosen by query-sample selection; the student
  learns from hints, distillation and self learning.
* ``swing``: Swing distillation (Li et al., arXiv 2022) on a next-item softmax model.

See docs/commands/distill.md.
"""
