"""A PLD grid that fits in memory.

``dp_accounting``'s PLD accountant holds the composed privacy loss on a grid of interval
``Delta`` over the range ``W`` outside which its mass is below 1e-15: about ``W / Delta``
points of ~90 bytes each at the peak of the FFT composition, gigabytes at low noise.
``pld_interval`` estimates ``W`` by the RDP epsilon at ``delta = 1e-15`` (a few orders first:
each bounds the all-orders epsilon from above) and widens ``Delta`` to
``W / MAX_LOSS_POINTS`` when that exceeds the requested interval. A wider grid is still
pessimistic (every loss is rounded up), so the epsilon stays an upper bound, only less tight.
See docs/epsilon.md ("How the privacy is accounted").
"""

from __future__ import annotations

import dp_accounting
from dp_accounting import rdp as dp_rdp

DEFAULT_INTERVAL = 1e-4  # dp_accounting's default
COARSE_INTERVAL = 1e-3
# Grid points of one composed PLD: ~360 MB at its peak.
MAX_LOSS_POINTS = 4_000_000
_TAIL_DELTA = 1e-15
# A subset of dp_accounting's default RDP orders (its epsilon is >= the all-orders one).
_FEW_ORDERS = (2.0, 4.0, 8.0, 16.0, 32.0, 128.0)


def pld_interval(event: dp_accounting.DpEvent, interval: float = DEFAULT_INTERVAL) -> float:
  """``interval``, widened so that composing ``event`` takes <= ~MAX_LOSS_POINTS points."""
  if dp_rdp.RdpAccountant(_FEW_ORDERS).compose(event).get_epsilon(
      _TAIL_DELTA) <= interval * MAX_LOSS_POINTS:
    return interval
  loss_range = dp_rdp.RdpAccountant().compose(event).get_epsilon(_TAIL_DELTA)
  return max(interval, loss_range / MAX_LOSS_POINTS)
