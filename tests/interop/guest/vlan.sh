# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_script vlan: the guest on a trunk port of VLANs 10 and 20 (no native VLAN); the host's
# tap (10.77.0.1) is an access port of VLAN 10. 802.1Q subinterfaces from the guest kernel's
# 8021q module: eth0.10 (10.77.0.2) reaches the host, tagged on the ring and untagged at the
# tap, TCP both ways with the driver's offloads; eth0.20 (10.77.20.2) and untagged eth0 reach
# nothing: ARP in VLAN 20 floods to no port of the host's, untagged frames on a trunk without
# a native VLAN are dropped (`vlan_filtered`).
ip link add link eth0 name eth0.10 type vlan id 10 || echo "GUEST_VLAN_ERR eth0.10"
ip link add link eth0 name eth0.20 type vlan id 20 || echo "GUEST_VLAN_ERR eth0.20"
ip link set eth0.10 up; ip link set eth0.20 up
ip addr add 10.77.0.2/24 dev eth0.10
ip addr add 10.77.20.2/24 dev eth0.20
echo "GUEST_NET_READY"
i=0; while [ "$(inechos)" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
echo "GUEST_ECHOS_IN $(inechos)"
echo "GUEST_PING $(ping -c 3 -W 5 10.77.0.1 | grep -o '[0-9]* packets received')"
for t in tcp_g2h tcp_h2g; do
  if [ $t = tcp_h2g ]; then r=-R; else r=; fi
  iperf_once -t 3 $r; iperf_report $t $?
done
# VLAN 20: the host's address asked for from 10.77.20.2; no port of VLAN 20 answers.
echo "GUEST_ARP20 $(arping -c 3 -w 4 -I eth0.20 -s 10.77.20.2 10.77.0.1 2>&1 | grep -o 'Received [0-9]*' | grep -o '[0-9]*')"
# Untagged on the trunk (eth0 has no address: the requests ask from 0.0.0.0).
echo "GUEST_ARP0 $(arping -c 3 -w 4 -I eth0 10.77.0.1 2>&1 | grep -o 'Received [0-9]*' | grep -o '[0-9]*')"
echo "GUEST_VLAN_DONE"
# let the last completions come back (tx_packets counts reclaimed buffers), until stable
last=-1; i=0; while [ "$(cat $S/tx_packets)" != "$last" ] && [ $i -lt 20 ]; do last=$(cat $S/tx_packets); sleep 0.5; i=$((i+1)); done
