# guest_script tap-setup: the guest's address only (the cases that script the rest).
ip addr add 10.77.0.2/24 dev eth0
echo "GUEST_NET_READY"
