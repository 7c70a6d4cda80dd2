#!/bin/bash
# runs in a buildah RUN step: start containerd (content store only) and import the archives
set -e
mkdir -p /run/containerd
containerd >/tmp/containerd.log 2>&1 &
for i in $(seq 1 50); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && break; sleep 0.2; done
for t in /images/*.tar; do
  ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests "$t"
done
ctr --namespace=k8s.io images list -q
kill %1; wait || true
rm -rf /run/containerd /run/nri /tmp/containerd.log
