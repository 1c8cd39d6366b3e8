# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_script sink: pktgen 60-byte frames out of eth0 for 3 s.
echo "add_device eth0" > /proc/net/pktgen/kpktgend_0; P=/proc/net/pktgen/eth0
for c in "count 0" "pkt_size 60" "delay 0" "clone_skb 0" "burst 1" "dst 10.99.0.1" "dst_mac 02:00:00:00:00:09" "udp_dst_min 9" "udp_dst_max 9"; do
  echo "$c" > $P || echo "GUEST_WARN pktgen rejected $c"; done
echo start > /proc/net/pktgen/pgctrl & sleep 3; echo stop > /proc/net/pktgen/pgctrl; wait
echo "GUEST_PKTGEN $(grep -oE '[0-9]+pps|OK: .*\(' $P | tr '\n' ' ')"
# let the last completions come back (tx_packets counts reclaimed buffers), until stable
last=-1; i=0; while [ "$(cat $S/tx_packets)" != "$last" ] && [ $i -lt 20 ]; do last=$(cat $S/tx_packets); sleep 0.5; i=$((i+1)); done
