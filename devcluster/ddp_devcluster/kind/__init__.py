"""The kind cluster: a node image assembled from the cached binaries (nodeimage, and the pods'
sandbox binary: pause), the host's image registry (registry), the cluster itself (cluster) and
the end-to-end stack on it, the operator and Kueue as processes of this machine (stack)."""
