#!/bin/bash
# Captures LLDP frames that lldpd sends: ./capture.sh NAME 'lldpcli line'...
# (as root). lldpd speaks for a switch in one network namespace, tcpdump
# listens in another, over a veth pair; both namespaces go at the end. Extra
# lldpd options come from $LLDPD_ARGS. Writes NAME.pcap in the current folder;
# the first frame's bytes are the pcap's from offset 40 (24-byte file header,
# 16-byte record header) for the record's length.
set -u
name=$1; shift
dir=$(pwd)
printf '%s\n' "$@" > "$dir/$name.conf"
ip netns add capsw; ip netns add capnode
ip link add swp7 netns capsw type veth peer name eth0 netns capnode
ip -n capsw link set lo up; ip -n capnode link set lo up
ip -n capsw link set swp7 address 52:54:00:aa:00:01
ip -n capnode link set eth0 address 52:54:00:bb:00:07
ip -n capsw link set swp7 up; ip -n capnode link set eth0 up
ip -n capsw addr add 192.0.2.1/24 dev swp7
ip netns exec capnode timeout 20 tcpdump -i eth0 -c 2 -w "$dir/$name.pcap" ether proto 0x88cc 2>/dev/null &
td=$!
sleep 1
ip netns exec capsw lldpd -d -u "$dir/$name.sock" -O "$dir/$name.conf" -I swp7 ${LLDPD_ARGS:-} 2>"$dir/$name.log" &
lp=$!
wait $td
kill $lp; wait $lp
ip netns del capsw; ip netns del capnode
