"""Empirical privacy auditing: canaries and the one-run epsilon lower bound.

``sparse-dp audit`` (:mod:`sparse_dp.jobs.audit.audit_command`) trains the pCTR job with
canaries and reports, per algorithm, the lower bound of Steinke, Nasr and
Jagielski 2023 (:mod:`.bound`, :mod:`.one_run`) next to the claimed epsilon,
with the audit's power (:mod:`.power`) and the canaries' exposure
(:mod:`.exposure`). The broken mechanisms of the audit's negative controls
live in :mod:`.testing` only.
"""

from sparse_dp.jobs.audit.bound import epsilon_lower_bound
from sparse_dp.jobs.audit.exposure import exposures
from sparse_dp.jobs.audit.one_run import OneRunAudit, audit

__all__ = ["OneRunAudit", "audit", "epsilon_lower_bound", "exposures"]
