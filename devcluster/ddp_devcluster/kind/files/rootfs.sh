#!/bin/bash
# Runs in the base image: the root filesystems of two images the node image holds.
# /out/kube-proxy: iptables (nft and legacy) and conntrack with their libraries, for kube-proxy.
# /out/helper: Debian's static busybox with its applets, for local-path-provisioner's helper pods.
set -euo pipefail
O=/out/kube-proxy
mkdir -p $O/usr/sbin $O/usr/lib/x86_64-linux-gnu $O/lib64 $O/etc $O/var/run $O/run $O/tmp
for b in /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi /usr/sbin/conntrack; do
  cp -a $b $O/usr/sbin/
  for l in $(ldd $b | grep -o '/[^ ]*'); do cp -L --parents $l $O/ 2>/dev/null || true; done
done
cp -a /usr/lib/x86_64-linux-gnu/xtables $O/usr/lib/x86_64-linux-gnu/
for l in $(ldd /usr/lib/x86_64-linux-gnu/xtables/*.so | grep -o '/[^ ]*' | sort -u); do
  [ -e $O$l ] || cp -L --parents $l $O/ 2>/dev/null || true
done
cd $O/usr/sbin
for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sf xtables-nft-multi $n; ln -sf xtables-nft-multi ${n/iptables/iptables-nft}
done
for n in iptables-legacy iptables-legacy-save iptables-legacy-restore ip6tables-legacy \
         ip6tables-legacy-save ip6tables-legacy-restore; do
  ln -sf xtables-legacy-multi $n
done
cp -a /etc/ethertypes /etc/protocols /etc/services $O/etc/ 2>/dev/null || true
echo 'hosts: files dns' > $O/etc/nsswitch.conf
H=/out/helper
mkdir -p $H/bin $H/tmp
cp /bin/busybox $H/bin/busybox
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox $H/bin/$a; done
