"""The DP teacher's privacy: a teacher without a DP record is refused."""

import pytest

from sparse_dp.jobs.distill import dp_teacher


def test_a_teacher_without_dp_record_is_refused():
  from sparse_dp.models.pctr import build_pctr_model
  with pytest.raises(ValueError, match="the teacher has no DP record"):
    dp_teacher.teacher_privacy(build_pctr_model([5] * 26, (4,)))
