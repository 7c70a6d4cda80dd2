"""The kind cluster: a node image assembled from the cached binaries (nodeimage), the host's
image registry (registry) and the cluster itself (cluster)."""
