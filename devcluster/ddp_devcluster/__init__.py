"""ddp_devcluster: a Kubernetes cluster on this machine, for development and tests only.

Owns the embedded control plane (:mod:`~ddp_devcluster.plane`, its certificates and the
binaries it builds: :mod:`~ddp_devcluster.build`, :mod:`~ddp_devcluster.versions`), a real node
(:mod:`ddp_devcluster.node`), the kind cluster (:mod:`ddp_devcluster.kind`), the two shipped
images (:mod:`~ddp_devcluster.images`), the operator, Kueue and Prometheus as processes, the
whole stack (:mod:`~ddp_devcluster.stack`), ``make demo`` (:mod:`~ddp_devcluster.demo`), the
pytest fixtures and ``make test``'s two lanes (:mod:`~ddp_devcluster.lanes`). It may import
every package of the project; none imports it, and none is installed with it.
"""
