# shellcheck shell=sh disable=SC2034,SC2086,SC2154  # fragments of one /run.sh (busybox sh): S, N set in probe.sh
# guest_script gen: receive what pvnet's generator sends.
# wait until frames stop arriving (the generator ends with its end marker)
last=-1; same=0; i=0
while [ $i -lt 240 ]; do r=$(cat $S/rx_packets)
  if [ "$r" = "$last" ] && [ "$r" != 0 ]; then same=$((same+1)); [ $same -ge 8 ] && break; else same=0; fi
  last=$r; sleep 0.25; i=$((i+1)); done
