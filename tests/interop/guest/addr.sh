# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_script tap-setup: the guest's address only (the cases that script the rest).
ip addr add 10.77.0.2/24 dev eth0
echo "GUEST_NET_READY"
