# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# The end of guest_script's programs: eth0's counters.
echo "GUEST_STATS tx_packets=$(cat $S/tx_packets) rx_packets=$(cat $S/rx_packets) tx_dropped=$(cat $S/tx_dropped) rx_dropped=$(cat $S/rx_dropped)"
