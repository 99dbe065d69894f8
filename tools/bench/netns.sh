#!/usr/bin/env bash
# Two network namespaces joined by a veth pair: one for the verifier side
# (gateway, verifiers and the benchmark client), one for the drafters, as
# two hosts on one link. Needs root and iproute2. Idempotent.
#
#   tools/bench/netns.sh up                 # make them
#   ip netns exec specmesh-v specmesh bench --up --model qwen2.5-coder-1.5b \
#       --draft-model smollm2-135m --verifier-cpus 0 --drafter-cpus 1 \
#       --drafter-netns specmesh-d --drafter-host 10.250.0.2 --drafter-rtt-ms 5 ...
#   tools/bench/netns.sh down               # remove them
#
# The round trip itself is added by the delay proxy `--drafter-rtt-ms`
# puts in front of each drafter (this kernel has no netem qdisc; see
# crates/harness/src/link.rs): the veth link alone adds ~0.05 ms.
#
# Env: SPECMESH_NETNS_V / SPECMESH_NETNS_D (namespace names, default
# specmesh-v / specmesh-d), SPECMESH_NETNS_NET (the /24's first three
# octets, default 10.250.0).
set -euo pipefail

v="${SPECMESH_NETNS_V:-specmesh-v}"
d="${SPECMESH_NETNS_D:-specmesh-d}"
net="${SPECMESH_NETNS_NET:-10.250.0}"
# Interface names are at most 15 bytes.
veth_v="${v:0:10}-veth"
veth_d="${d:0:10}-veth"

up() {
    for ns in "$v" "$d"; do
        ip netns list | grep -qw "^$ns" || ip netns add "$ns"
        ip -n "$ns" link set lo up
    done
    if ! ip -n "$v" link show "$veth_v" >/dev/null 2>&1; then
        ip link add "$veth_v" type veth peer name "$veth_d"
        ip link set "$veth_v" netns "$v"
        ip link set "$veth_d" netns "$d"
        ip -n "$v" addr add "$net.1/24" dev "$veth_v"
        ip -n "$d" addr add "$net.2/24" dev "$veth_d"
    fi
    ip -n "$v" link set "$veth_v" up
    ip -n "$d" link set "$veth_d" up
    echo "namespaces $v ($net.1) and $d ($net.2) up"
}

down() {
    for ns in "$v" "$d"; do
        ip netns list | grep -qw "^$ns" && ip netns del "$ns"
    done
    echo "namespaces $v and $d removed"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
