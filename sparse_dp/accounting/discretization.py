"""A PLD grid that fits in memory.

``dp_accounting``'s PLD accountant holds the composed privacy loss on a grid of
interval ``Delta`` over the range outside which its mass is below 1e-15, a
range found by a Chernoff bound on the moments of the loss: about ``W / Delta``
points of ~90 bytes each at the peak of the FFT composition. ``W`` grows with
the loss itself: at noise multiplier 0.15, q = 0.1 and 1,000 steps the default
``Delta = 1e-4`` takes 2.5 GB (5.6 GB at 0.1), enough to be killed for memory.

``pld_interval`` estimates ``W`` by the RDP epsilon at ``delta = 1e-15`` (the
same Chernoff bound over all orders, cheap to compute and at least the upper
end of the range) and widens ``Delta`` to ``W / MAX_LOSS_POINTS`` when that
exceeds the requested interval. A wider grid is still pessimistic (every loss
is rounded up), so the epsilon stays an upper bound, only less tight: each
step's loss moves by less than ``Delta``.
"""

from __future__ import annotations

import dp_accounting
from dp_accounting import rdp as dp_rdp

DEFAULT_INTERVAL = 1e-4  # dp_accounting's default
COARSE_INTERVAL = 1e-3
# Grid points of one composed PLD: ~360 MB at its peak.
MAX_LOSS_POINTS = 4_000_000
_TAIL_DELTA = 1e-15


def pld_interval(event: dp_accounting.DpEvent, interval: float = DEFAULT_INTERVAL) -> float:
  """``interval``, widened so that composing ``event`` takes <= ~MAX_LOSS_POINTS points."""
  loss_range = dp_rdp.RdpAccountant().compose(event).get_epsilon(_TAIL_DELTA)
  return max(interval, loss_range / MAX_LOSS_POINTS)
