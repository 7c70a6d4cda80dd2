#!/bin/bash
# Runs in a privileged container of the base image (nodeimage.py), /var/lib/containerd being a
# host folder that becomes the node image's containerd root. Twice: first for the preload, the
# OCI layout in /layout of the trainer's dependency layers imported and unpacked into the
# overlayfs snapshotter (nodeimage.py moves the snapshots out to the preload folder
# afterwards); then, on that root, the cluster's archives in /images imported (not unpacked).
set -e
mkdir -p /run/containerd
containerd >/tmp/containerd.log 2>&1 &
for i in $(seq 1 100); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && break; sleep 0.2; done
for t in /images/*.tar; do
  [ -f "$t" ] || continue
  ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests "$t"
done
if [ -f /layout/index.json ]; then
  tar -C /layout -cf - . \
    | ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned --snapshotter overlayfs -
  # the layers are unpacked; their blobs are not kept (kind's containerd discards them too)
  for d in ${LAYERS}; do ctr --namespace=k8s.io content rm "$d"; done
fi
ctr --namespace=k8s.io images list -q
kill %1; wait || true
