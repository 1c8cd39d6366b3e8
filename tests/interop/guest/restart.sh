# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_restart (after guest_script tap-setup): ping the host every 0.1 s while pvnet is
# killed and started again, then iperf3.
echo "GUEST_PING_START"
# Busybox ping: one request every 0.1 s by the guest's clock, so a reply arrives at its
# sequence number x 0.1 s plus its round-trip time: the longest time between two replies'
# arrivals is how long the guest heard nothing (requests sent while pvnet was away wait in the
# ring and are answered late, not lost).
t_a=$(cut -d' ' -f1 /proc/uptime); ping -c 200 -i 0.1 10.77.0.1 > /tmp/ping.txt 2>&1; t_b=$(cut -d' ' -f1 /proc/uptime)
awk -v a="$t_a" -v b="$t_b" '/bytes from/ { split($5, q, "="); split($7, r, "="); t = q[2] * 0.1 + r[2] / 1000; n++
    if (n > 1 && t - p > g) g = t - p; p = t; if (r[2] / 1000 > m) m = r[2] / 1000 }
  END { printf "GUEST_PING_GAP replies=%d gap=%.2f max_rtt=%.2f took=%.1f\n", n, g, m, b - a }' /tmp/ping.txt
iperf3 -c 10.77.0.1 -f m -t 3 > /tmp/ip.txt 2>&1; echo "GUEST_IPERF_RC tcp_g2h $?"
grep -E 'receiver' /tmp/ip.txt | sed "s/^/GUEST_IPERF tcp_g2h /"
echo "GUEST_VIRTIO_ERRORS $(dmesg | grep -ciE 'virtio.*(error|fail|timeout)|NETDEV WATCHDOG')"
dmesg | grep -iE 'virtio.*(error|fail|timeout)|NETDEV WATCHDOG' | head -3 | sed 's/^/GUEST_DMESG /'
