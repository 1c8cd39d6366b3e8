# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_migrate (after guest_script tap-setup and CHURN=N): a download and a ping across a
# live migration.
# A receive window of 4 MiB from the start, then the link down while the host migrates the
# guest: what pvnet writes into the posted receive buffers meanwhile is read by the guest only
# on the destination (napi is off while the link is down). Memory churn keeps the migration
# iterating (it cannot converge while 8 MiB are rewritten over and over) until it stops.
echo "4096 4194304 16777216" > /proc/sys/net/ipv4/tcp_rmem
wget -q -O /tmp/recv.bin http://10.77.0.1:8077/stream &
w=$!
snmp() { awk -v t="$1:" -v f="$2" '$1==t{if(!h){for(i=1;i<=NF;i++)if($i==f)c=i;h=1}else{print $c}}' /proc/net/snmp; }
sleep 1; e0=$(inechos); ip link set eth0 down; echo "GUEST_DOWN"
# A fixed amount of churn, not a time: the guest's clock is not to be trusted across the
# migration. Then say how long it took.
c0=$(cut -d' ' -f1 /proc/uptime)
i=0; while [ $i -lt $CHURN ]; do dd if=/dev/urandom of=/tmp/churn bs=1M count=8 2>/dev/null; i=$((i+1)); done
rm -f /tmp/churn; echo "GUEST_CHURN secs=$(awk -v a="$c0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}')"; sleep 2
ip link set eth0 up; echo "GUEST_UP"; sleep 1
echo "GUEST_ECHOS held=$(( $(inechos) - e0 )) ip_hdr_errors=$(snmp Ip InHdrErrors) icmp_csum_errors=$(snmp Icmp InCsumErrors) icmp_errors=$(snmp Icmp InErrors)"
wait $w; echo "GUEST_WGET_RC $?"
echo "GUEST_MD5 $(md5sum /tmp/recv.bin | cut -d' ' -f1) bytes=$(wc -c < /tmp/recv.bin)"
# (busybox ping gives up when the link goes down: a new one, on the destination)
ping -c 50 -i 0.1 10.77.0.1 > /tmp/ping.txt 2>&1
awk '/bytes from/ { split($5, q, "="); split($7, r, "="); t = q[2] * 0.1 + r[2] / 1000; n++
    if (n > 1 && t - p > g) g = t - p; p = t }
  END { printf "GUEST_PING_GAP replies=%d gap=%.2f\n", n, g }' /tmp/ping.txt
echo "GUEST_VIRTIO_ERRORS $(dmesg | grep -ciE 'virtio.*(error|fail|timeout)|NETDEV WATCHDOG')"
