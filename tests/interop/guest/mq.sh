# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_mq (after guest_script tap-setup): both queue pairs, iperf3 from each vCPU and back,
# the per-queue counters.
S=/sys/class/net/eth0/statistics
ethtool -L eth0 combined 2; echo "GUEST_CHANNELS rc=$? $(ethtool -l eth0 | awk '/^Current/{c=1} c&&/Combined/{print "combined=" $2}')"
i=0; while ! ping -c 1 -W 1 10.77.0.1 > /dev/null 2>&1 && [ $i -lt 30 ]; do i=$((i+1)); done
run_iperf() { tag=$1; shift; "$@" > /tmp/ip.$tag.txt 2>&1; echo "GUEST_IPERF_RC $tag $?"
  grep -E 'receiver' /tmp/ip.$tag.txt | tail -1 | sed "s/^/GUEST_IPERF $tag /"; }
run_iperf g2h_cpu0 taskset 1 iperf3 -c 10.77.0.1 -p 5201 -f m -t 3 &
run_iperf g2h_cpu1 taskset 2 iperf3 -c 10.77.0.1 -p 5202 -f m -t 3 &
wait
run_iperf h2g iperf3 -c 10.77.0.1 -p 5201 -f m -t 3 -R -P 12
last=-1; i=0; while [ "$(cat $S/tx_packets)" != "$last" ] && [ $i -lt 20 ]; do last=$(cat $S/tx_packets); sleep 0.5; i=$((i+1)); done
ethtool -S eth0 | awk '/(rx|tx)_queue_[0-9]+_packets/{gsub(":", ""); printf "%s=%s ", $1, $2} END{print ""}' | sed 's/^/GUEST_QUEUES /'
echo "GUEST_STATS tx_packets=$(cat $S/tx_packets) rx_packets=$(cat $S/rx_packets)"
