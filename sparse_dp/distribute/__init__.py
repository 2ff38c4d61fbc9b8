"""Training past one process: multi-worker and parameter-server strategies.

* ``MultiWorkerMirroredStrategy``: ``make_private`` and Keras ``fit`` as on one
  machine (every worker takes worker 0's secret seed: :mod:`.workers`).
* ``ParameterServerStrategy``: :class:`ParameterServerTraining` (Keras ``fit``
  is refused there), tables sharded across the parameter servers
  (:mod:`.shards`); :mod:`.local_cluster` starts a localhost cluster.

See docs/clusters.md.
"""

from sparse_dp.distribute.parameter_servers import ParameterServerTraining

__all__ = ["ParameterServerTraining"]
