"""ddp_devcluster: Kubernetes clusters on this machine, for development and tests only.

Owns the embedded control plane (:mod:`~ddp_devcluster.plane`, its certificates and the
binaries it builds: :mod:`~ddp_devcluster.build`, :mod:`~ddp_devcluster.versions`), the kind
cluster of four machines and the end-to-end stack on it (:mod:`ddp_devcluster.kind`), the two
shipped images (:mod:`~ddp_devcluster.images`), the chart's install
(:mod:`~ddp_devcluster.chart`), the operator, Kueue and Prometheus as processes, ``make demo``
(:mod:`~ddp_devcluster.demo`), the one test harness (:mod:`~ddp_devcluster.harness`), the
pytest fixtures and ``make test``'s two lanes (:mod:`~ddp_devcluster.lanes`). It may import
every package of the project; none imports it, and none is installed with it.
"""
