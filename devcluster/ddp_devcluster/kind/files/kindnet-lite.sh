#!/bin/bash
# Stand-in for kindnetd (whose image cannot be pulled or built here): writes this node's
# CNI config from its podCIDR and keeps a route to every other node's podCIDR via its IP.
set -u
NODE=$(hostname)
KC="kubectl --kubeconfig=/etc/kubernetes/kubelet.conf"
CONF=/etc/cni/net.d/10-kindnet-lite.conflist
while true; do
  if [ -f /etc/kubernetes/kubelet.conf ]; then
    $KC get nodes -o jsonpath='{range .items[*]}{.metadata.name}|{.spec.podCIDR}|{.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}' 2>/dev/null |
    while IFS='|' read -r n cidr ip; do
      case "$cidr" in */*) ;; *) continue ;; esac
      if [ "$n" = "$NODE" ]; then
        if [ ! -f $CONF ]; then
          mkdir -p /etc/cni/net.d
          cat > $CONF.tmp <<JSON
{"cniVersion":"0.3.1","name":"kindnet","plugins":[
 {"type":"ptp","ipMasq":false,"mtu":1500,
  "ipam":{"type":"host-local","dataDir":"/run/cni-ipam-state","routes":[{"dst":"0.0.0.0/0"}],"ranges":[[{"subnet":"$cidr"}]]}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}
JSON
          mv $CONF.tmp $CONF
          echo "wrote $CONF for $cidr"
        fi
      elif [ -n "$ip" ]; then
        ip route replace "$cidr" via "$ip" 2>/dev/null
      fi
    done
    iptables -t nat -C POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -m addrtype ! --dst-type LOCAL -j MASQUERADE 2>/dev/null ||
      iptables -t nat -A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -m addrtype ! --dst-type LOCAL -j MASQUERADE
  fi
  sleep 3
done
