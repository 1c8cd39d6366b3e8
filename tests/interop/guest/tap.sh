# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_script tap: through pvnet switch to the host's tap (10.77.0.1).
# through pvnet switch to the host's tap (10.77.0.1): ping both ways, TCP and UDP both ways
ip addr add 10.77.0.2/24 dev eth0
echo "GUEST_NET_READY"
i=0; while [ "$(inechos)" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
echo "GUEST_ECHOS_IN $(inechos)"
echo "GUEST_PING $(ping -c 3 -W 5 10.77.0.1 | grep -o '[0-9]* packets received')"
# A test whose UDP handshake fails as it starts ("unable to read from stream socket": iperf3
# 3.12 in reverse mode waits for its server's answer among at most 12 datagrams of the flood,
# and an fq_codel queue that overflows drops from the head of that flow, the answer first;
# docs/robustness.md) runs once more, and says so.
run_iperf() { tag=$1; shift; iperf_once "$@"; rc=$?
  if [ $rc != 0 ] && grep -q 'unable to read from stream socket' /tmp/ip.txt && ! grep -q receiver /tmp/ip.txt; then
    tail -3 /tmp/ip.txt | sed "s/^/GUEST_IPERF_RETRY $tag /"; sleep 1
    iperf_once "$@"; rc=$?
  fi
  iperf_report $tag $rc; }
run_iperf tcp_g2h -t 3
run_iperf tcp_h2g -t 3 -R
run_iperf udp_g2h -t 3 -u -l 22 -b 0
run_iperf udp_h2g -t 3 -u -l 22 -b 0 -R
# let the last completions come back (tx_packets counts reclaimed buffers), until stable
last=-1; i=0; while [ "$(cat $S/tx_packets)" != "$last" ] && [ $i -lt 20 ]; do last=$(cat $S/tx_packets); sleep 0.5; i=$((i+1)); done
