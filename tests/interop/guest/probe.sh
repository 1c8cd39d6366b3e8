# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# The guest's /run.sh starts with this (tests/interop/run.sh guest_script): the driver and
# features the guest sees, eth0 up, its carrier.
S=/sys/class/net/eth0/statistics; N=/sys/class/net/eth0
echo "GUEST_PROBE driver=$(basename "$(readlink $N/device/driver)") features=$(cat $N/device/features)"
ip link set eth0 up
i=0; while [ "$(cat $N/operstate)" != up ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "GUEST_LINK carrier=$(cat $N/carrier) operstate=$(cat $N/operstate)"
# inechos: the ICMP echo requests the guest has taken in (/proc/net/snmp Icmp InEchos).
inechos() { awk '/^Icmp:/{if(!h){for(i=1;i<=NF;i++)if($i=="InEchos")c=i;h=1}else{print $c}}' /proc/net/snmp; }
# iperf_once ARGS...: one iperf3 run to the host's end (10.77.0.1), its output in /tmp/ip.txt;
# iperf_report TAG RC: that run's exit status, summary lines and, on failure, its last lines.
iperf_once() { iperf3 -c 10.77.0.1 -f m "$@" > /tmp/ip.txt 2>&1; }
iperf_report() { echo "GUEST_IPERF_RC $1 $2"
  grep -E 'receiver|sender' /tmp/ip.txt | sed "s/^/GUEST_IPERF $1 /"
  [ "$2" = 0 ] || tail -3 /tmp/ip.txt | sed "s/^/GUEST_IPERF_ERR $1 /"; }
