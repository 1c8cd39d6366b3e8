# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_script mtu: QEMU's host_mtu=9000 through pvnet switch to the host's tap (10.77.0.1,
# MTU 9100): the MTU the driver took, jumbo pings both ways without fragmenting, TCP both ways.
echo "GUEST_MTU $(cat /sys/class/net/eth0/mtu)"
ip addr add 10.77.0.2/24 dev eth0
echo "GUEST_NET_READY"
i=0; while [ "$(inechos)" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
echo "GUEST_ECHOS_IN $(inechos)"
# (busybox ping has no -M: at the guest's MTU of 9000 a 9000-byte IP packet goes whole anyway)
echo "GUEST_PING $(ping -c 3 -W 5 -s 8972 10.77.0.1 | grep -o '[0-9]* packets received')"
for t in tcp_g2h tcp_h2g; do
  if [ $t = tcp_h2g ]; then r=-R; else r=; fi
  iperf_once -t 3 $r; iperf_report $t $?
done
# the host's too-big pings (9000 B of payload: a 9042-byte frame) arrive now, and are not seen
echo "GUEST_BIG_WAIT"
sleep 4
echo "GUEST_ECHOS_FINAL $(inechos)"
