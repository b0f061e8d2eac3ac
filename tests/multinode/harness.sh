#!/usr/bin/env bash
# Multi-node on one machine: each node is a network namespace (its own address and
# loopback) entered with its own UTS namespace (hostname nodeI) and mount namespace, so
# Open MPI sees separate hosts: shared memory between the ranks of a node, TCP between
# nodes. The nodes hang off one bridge (in a namespace of its own), so the host's network
# is never touched and deleting the namespaces removes every link and tc rule. mpirun
# runs on node0 like on a cluster's head node and starts the other nodes' daemons with an
# rsh agent that enters the node (`ip netns exec`) with a clean environment, as ssh would.
#
# Options of a cluster: the inter-node link shaped at every node's egress (--rate, e.g.
# 1gbit; --delay needs the kernel's netem), and a private directory: a path that each node
# sees backed by its own folder (a bind mount inside the node's mount namespace, made
# when a node is entered, so it disappears with the node's processes), i.e. node-local
# disks.
#
# Used as a command (run `harness.sh help`) or sourced by tests (mn_* functions). Nothing
# outlives a cluster: `down` kills every process in its namespaces and deletes them, tests
# call it from an EXIT trap, and `cleanup` (run first and last by the ctest fixture)
# removes the clusters of owners that died without it.
#
# Root only. A machine where namespaces cannot be made gets exit status 77 and the reason
# (`probe`), which ctest reports as a skipped test.

MN_STATE=${NDMESH_MULTINODE_STATE:-/tmp/ndmesh-multinode}
MN_SUBNET=10.77.0
MN_HARNESS=$(readlink -f "${BASH_SOURCE[0]}")

mn_err() { echo "multinode: $*" >&2; }

# mn_proc_id PID: "PID STARTTIME" of a live process (not a zombie), empty otherwise; the
# start time tells a reused pid from the owner.
mn_proc_id() {
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 0
  stat=${stat##*) }  # after the command name, which may hold spaces
  set -- $1 $stat
  [ "$2" = Z ] && return 0
  echo "$1 ${21}"
}

# Namespace names: ndmmn-<cluster>-<node> and ndmmn-<cluster>-sw (the bridge).
mn_ns() { echo "ndmmn-$1-$2"; }
mn_addr() { echo "$MN_SUBNET.$(($2 + 1))"; }

# mn_probe: 0 when this machine can host a cluster; else prints why and returns 77.
mn_probe() {
  local why="" ns="ndmmn-probe$$"
  if [ "$(id -u)" -ne 0 ]; then
    why="needs root (uid $(id -u)): network, UTS and mount namespaces"
  elif ! command -v ip > /dev/null || ! command -v tc > /dev/null || ! command -v unshare > /dev/null; then
    why="needs ip and tc (Debian: iproute2) and unshare (util-linux)"
  elif ! command -v mpirun > /dev/null; then
    why="needs mpirun (Debian: openmpi-bin)"
  elif ! ip netns add "$ns" 2> /dev/null; then
    why="cannot create a network namespace here (ip netns add failed: no CAP_SYS_ADMIN, or a container without it)"
  else
    if ! ip link add name mnprobe0 netns "$ns" type veth peer name mnprobe1 netns "$ns" 2> /dev/null; then
      why="cannot create a veth pair inside a network namespace"
    elif ! ip netns exec "$ns" unshare --uts --mount true 2> /dev/null; then
      why="cannot create UTS and mount namespaces (unshare --uts --mount failed)"
    fi
    ip netns del "$ns" 2> /dev/null
  fi
  if [ -n "$why" ]; then
    echo "multinode harness unavailable: $why"
    return 77
  fi
  return 0
}

# mn_has_netem: whether this kernel has the netem qdisc (delay); tbf shapes the rate.
# Probed once per shell (a namespace and a veth pair: up to seconds on a loaded machine,
# which a fault test must not spend between the fault's clock and the fault).
mn_has_netem() {
  if [ -z "${MN_NETEM:-}" ]; then
    local ns="ndmmn-netem$$"
    MN_NETEM=1
    if ip netns add "$ns" 2> /dev/null; then
      ip link add name mnprobe0 netns "$ns" type veth peer name mnprobe1 netns "$ns" 2> /dev/null &&
        ip netns exec "$ns" tc qdisc add dev mnprobe0 root netem delay 1ms 2> /dev/null && MN_NETEM=0
      ip netns del "$ns" 2> /dev/null
    fi
  fi
  return "$MN_NETEM"
}

# mn_up [--nodes N] [--ranks M] [--rate R] [--delay D] [--private DIR] [--name ID]
#       [--owner PID]: creates a cluster and prints its id. The owner (default: the caller's
# shell) is the process whose death makes the cluster a leftover for `cleanup`; 0 means
# none (a cluster made by hand lives until `down`).
mn_up() {
  local nodes=2 ranks=2 rate="" delay="" private="" id="" owner=$$ i ns sw
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=$2 ;;
      --ranks) ranks=$2 ;;
      --rate) rate=$2 ;;
      --delay) delay=$2 ;;
      --private) private=$2 ;;
      --name) id=$2 ;;
      --owner) owner=$2 ;;
      *) mn_err "up: unknown option $1 (see harness.sh help)"; return 2 ;;
    esac
    shift 2 || { mn_err "up: $1 needs a value"; return 2; }
  done
  [[ "$nodes" =~ ^[0-9]+$ && "$nodes" -ge 1 && "$nodes" -le 200 ]] || { mn_err "up: --nodes $nodes must be 1..200"; return 2; }
  [[ "$ranks" =~ ^[0-9]+$ && "$ranks" -ge 1 ]] || { mn_err "up: --ranks $ranks must be >= 1"; return 2; }
  [ -z "$id" ] && id="c$$$RANDOM"
  [[ "$id" =~ ^[a-z0-9]{1,24}$ ]] || { mn_err "up: --name $id must be 1-24 lowercase letters or digits"; return 2; }
  if [ -n "$private" ]; then
    [[ "$private" = /* ]] || { mn_err "up: --private $private must be an absolute path"; return 2; }
    mkdir -p "$private" || return 1
  fi
  local dir="$MN_STATE/$id"
  [ -e "$dir" ] && { mn_err "up: a cluster named $id exists ($dir); take it down first"; return 1; }
  mkdir -p "$dir/tmp" || return 1
  if [ "$owner" = 0 ]; then echo 0 > "$dir/owner"; else mn_proc_id "$owner" > "$dir/owner"; fi
  echo "$nodes" > "$dir/nodes"
  echo "$ranks" > "$dir/ranks"
  echo "$private" > "$dir/private_path"
  sw=$(mn_ns "$id" sw)
  {
    ip netns add "$sw" &&
      ip -n "$sw" link set lo up &&
      ip -n "$sw" link add br0 type bridge &&
      ip -n "$sw" link set br0 up
  } || { mn_err "up: cannot create the switch namespace $sw"; mn_down "$id"; return 1; }
  : > "$dir/hostfile"
  for ((i = 0; i < nodes; i++)); do
    ns=$(mn_ns "$id" "$i")
    {
      ip netns add "$ns" &&
        ip -n "$ns" link set lo up &&
        ip link add name eth0 netns "$ns" type veth peer name "p$i" netns "$sw" &&
        ip -n "$sw" link set "p$i" master br0 &&
        ip -n "$sw" link set "p$i" up &&
        ip -n "$ns" addr add "$(mn_addr "$id" "$i")/24" dev eth0 &&
        ip -n "$ns" link set eth0 up
    } || { mn_err "up: cannot create node $i ($ns)"; mn_down "$id"; return 1; }
    echo "$(mn_addr "$id" "$i") slots=$ranks" >> "$dir/hostfile"
    mkdir -p "$dir/disks/node$i/tmp"
    [ -n "$private" ] && mkdir -p "$dir/disks/node$i/private"
  done
  # The rsh agent Open MPI calls as `rsh <host> <daemon command>`.
  printf '#!/bin/sh\nexec bash %q _agent %q "$@"\n' "$MN_HARNESS" "$id" > "$dir/rsh"
  chmod +x "$dir/rsh"
  if [ -n "$rate$delay" ]; then
    mn_shape "$id" ${rate:+--rate "$rate"} ${delay:+--delay "$delay"} || { mn_down "$id"; return 1; }
  fi
  echo "$id"
}

# mn_down ID: kills every process of the cluster and deletes its namespaces and state.
mn_down() {
  local id=$1 ns pids round
  [ -n "$id" ] || return 0
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^ndmmn-$id-(sw|[0-9]+)$"); do
    for round in 1 2 3 4 5; do
      pids=$(ip netns pids "$ns" 2> /dev/null)
      [ -z "$pids" ] && break
      kill -9 $pids 2> /dev/null
      sleep 0.1
    done
    ip netns del "$ns" 2> /dev/null || mn_err "down: could not delete $ns"
  done
  rm -rf "${MN_STATE:?}/$id"
}

# mn_cleanup [--all]: takes down the clusters whose owner died (every cluster with --all)
# and namespaces of the harness that have no state left. Prints what it removed.
mn_cleanup() {
  local all=${1:-} id owner ns
  for d in "$MN_STATE"/*/; do
    [ -d "$d" ] || continue
    id=$(basename "$d")
    owner=$(cat "$d/owner" 2> /dev/null)
    if [ "$all" = --all ] || { [ "$owner" != 0 ] && [ "$(mn_proc_id "${owner%% *}")" != "$owner" ]; }; then
      echo "multinode: removing leftover cluster $id (owner ${owner%% *} gone)"
      mn_down "$id"
    fi
  done
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E '^ndmmn-'); do
    id=${ns#ndmmn-}
    id=${id%-*}
    [ -d "$MN_STATE/$id" ] && continue
    echo "multinode: removing leftover namespace $ns"
    mn_down "$id"
    ip netns del "$ns" 2> /dev/null
  done
}

# mn_leftovers: lists the harness's namespaces and cluster states (empty when clean).
mn_leftovers() {
  ip netns list 2> /dev/null | awk '{print $1}' | grep -E '^ndmmn-'
  ls -d "$MN_STATE"/*/ 2> /dev/null
  return 0
}

mn_nodes() { cat "$MN_STATE/$1/nodes"; }
mn_ranks() { cat "$MN_STATE/$1/ranks"; }

# mn_enter ID NODE cmd...: runs cmd on the node: its network, hostname nodeI, its private
# directory in place, and $MN_STATE/ID/tmp its own (a node-local temporary directory).
mn_enter() {
  local id=$1 node=$2 dir="$MN_STATE/$1"
  shift 2
  [ -d "$dir" ] || { mn_err "no cluster $id"; return 2; }
  local private
  private=$(cat "$dir/private_path")
  ip netns exec "$(mn_ns "$id" "$node")" unshare --uts --mount --propagation private -- \
    bash -c 'hostname "node$1" || exit 1
             mount --bind "$2/tmp" "$3" || exit 1
             if [ -n "$4" ]; then mount --bind "$2/private" "$4" || exit 1; fi
             shift 4; exec "$@"' _ "$node" "$dir/disks/node$node" "$dir/tmp" "$private" "$@"
}

# mn_tmp ID: the node-local temporary directory (the same path on every node, each node
# seeing its own).
mn_tmp() { echo "$MN_STATE/$1/tmp"; }

# The agent: `_agent ID HOST daemon-command...`. A clean environment like ssh's: what the
# job needs on other nodes must be forwarded (mpirun -x, ndmesh launch does it).
mn_agent() {
  local id=$1 host=$2 node
  shift 2
  node=$(($(echo "$host" | awk -F. '{print $4}') - 1))
  if [[ "$host" != "$MN_SUBNET".* ]] || [ "$node" -lt 0 ] || [ "$node" -ge "$(mn_nodes "$id")" ]; then
    mn_err "agent: $host is not a node of cluster $id"
    return 255
  fi
  mn_enter "$id" "$node" env -i PATH="$PATH" HOME="${HOME:-/root}" bash -c "$*"
}

# mn_mpirun_options ID: the mpirun options a job on the cluster needs (one per line).
mn_mpirun_options() {
  local dir="$MN_STATE/$1"
  printf '%s\n' --hostfile "$dir/hostfile" --mca plm_rsh_agent "$dir/rsh" --mca plm_rsh_no_tree_spawn 1 \
    --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include "$MN_SUBNET.0/24" \
    --mca oob_tcp_if_include "$MN_SUBNET.0/24" --mca btl_tcp_port_min_v4 30000
}

# mn_mpirun ID mpirun-args...: mpirun on node0 with the cluster's options (as root,
# --allow-run-as-root; more ranks than slots, --oversubscribe) and NDMESH_* forwarded.
mn_mpirun() {
  local id=$1 opts=() v
  shift
  mapfile -t opts < <(mn_mpirun_options "$id")
  for v in $(compgen -e | grep '^NDMESH_'); do opts+=(-x "$v"); done
  mn_enter "$id" 0 mpirun --allow-run-as-root "${opts[@]}" "$@"
}

# mn_launch ID NDMESH -n N -- prog args: `ndmesh launch` on node0 with the cluster's
# mpirun options between its two `--`.
mn_launch() {
  local id=$1 ndmesh=$2 opts=()
  shift 2
  local pre=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    pre+=("$1")
    shift
  done
  shift
  mapfile -t opts < <(mn_mpirun_options "$id")
  # Its socket in node0's own temporary directory: ranks on other nodes cannot reach it.
  mn_enter "$id" 0 env TMPDIR="$(mn_tmp "$id")" "$ndmesh" launch "${pre[@]}" -- "${opts[@]}" -- "$@"
}

# mn_shape ID [--rate R] [--delay D] [--node I]: the egress of every node (or node I).
# --rate alone uses tbf; --delay needs netem. No option: removes the shaping.
mn_shape() {
  local id=$1 rate="" delay="" only="" i ns
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2 ;;
      --delay) delay=$2 ;;
      --node) only=$2 ;;
      *) mn_err "shape: unknown option $1"; return 2 ;;
    esac
    shift 2 || { mn_err "shape: $1 needs a value"; return 2; }
  done
  if [ -n "$delay" ] && ! mn_has_netem; then
    mn_err "shape: --delay needs the netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM); --rate works (tbf)"
    return 2
  fi
  for ((i = 0; i < $(mn_nodes "$id"); i++)); do
    [ -n "$only" ] && [ "$only" != "$i" ] && continue
    ns=$(mn_ns "$id" "$i")
    ip netns exec "$ns" tc qdisc del dev eth0 root 2> /dev/null
    if [ -n "$delay" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "$delay" ${rate:+rate "$rate"} limit 100000 || return 1
    elif [ -n "$rate" ]; then
      # A burst of 1 ms at the rate (at least 64 KiB: a GSO packet must fit), and a
      # queue of up to a second, so TCP sees a slow link rather than drops.
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 1s || return 1
    fi
  done
}

# mn_slow ID SECONDS [NODE]: makes every packet leaving the nodes (or NODE) take at least
# SECONDS: netem's delay when the kernel has it, else a tbf rate at which one full frame
# takes that long (the link still delivers, far beyond any timeout). Prints which.
mn_slow() {
  local id=$1 s=$2 node=${3:-}
  if mn_has_netem; then
    echo "multinode: link delay ${s} s (netem)"
    mn_shape "$id" --delay "${s}s" ${node:+--node "$node"}
  else
    local bits
    bits=$(awk -v s="$s" 'BEGIN{printf "%d", 1514 * 8 / s}')
    echo "multinode: no netem in this kernel; link rate ${bits} bit/s: a full frame takes ${s} s"
    local i ns
    for ((i = 0; i < $(mn_nodes "$id"); i++)); do
      [ -n "$node" ] && [ "$node" != "$i" ] && continue
      ns=$(mn_ns "$id" "$i")
      ip netns exec "$ns" tc qdisc del dev eth0 root 2> /dev/null
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${bits}bit" burst 1514 limit 10mb || return 1
    done
  fi
}

# mn_link ID down|up [NODE]: takes a node's link (default: the last node's) down or up.
mn_link() {
  local id=$1 state=$2 node=${3:-$(($(mn_nodes "$1") - 1))}
  ip -n "$(mn_ns "$id" "$node")" link set eth0 "$state"
}

# mn_kill_node ID NODE: SIGKILLs every process on the node at once (ranks and daemon),
# like a node losing power except that the kernel still resets its TCP connections.
mn_kill_node() {
  local pids
  pids=$(ip netns pids "$(mn_ns "$1" "$2")")
  [ -n "$pids" ] && kill -9 $pids
}

mn_help() {
  cat << 'EOF'
harness.sh: several nodes on one machine (network namespaces), for multi-node runs and tests. Root only.
  harness.sh probe                         exit 0 if usable here, else the reason and exit 77
  harness.sh up [--nodes 2] [--ranks 2] [--rate 1gbit] [--delay 1ms] [--private DIR] [--name ID]
                                           creates a cluster, prints its id (kept until `down`)
  harness.sh mpirun ID <mpirun args>       mpirun on node0 with the hostfile and options the cluster needs
  harness.sh launch ID NDMESH [launch opts] -- prog args
                                           `ndmesh launch` on node0 with those mpirun options
  harness.sh options ID                    the mpirun options, one per line (to write your own command)
  harness.sh exec ID NODE cmd...           runs cmd on node NODE (its network, hostname, private dir)
  harness.sh shape ID [--rate R] [--delay D] [--node I]   shapes node egress (no option: unshaped)
  harness.sh slow ID SECONDS [NODE]        every packet takes at least SECONDS (delay, or a crawling rate)
  harness.sh link ID down|up [NODE]        a node's link (default: the last node's)
  harness.sh kill-node ID NODE             SIGKILLs every process on the node
  harness.sh down ID                       kills the cluster's processes, deletes its namespaces
  harness.sh cleanup [--all]               removes clusters whose owner died (--all: every cluster)
  harness.sh leftovers                     lists the harness's namespaces and states (none when clean)
EOF
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  cmd=${1:-help}
  shift || true
  case $cmd in
    probe) mn_probe ;;
    up) mn_up --owner 0 "$@" ;;
    down) mn_down "$@" ;;
    cleanup) mn_cleanup "$@" ;;
    leftovers) mn_leftovers ;;
    mpirun) mn_mpirun "$@" ;;
    launch) mn_launch "$@" ;;
    options) mn_mpirun_options "$@" ;;
    exec) mn_enter "$@" ;;
    shape) mn_shape "$@" ;;
    slow) mn_slow "$@" ;;
    link) mn_link "$@" ;;
    kill-node) mn_kill_node "$@" ;;
    _agent) mn_agent "$@" ;;
    help | -h | --help) mn_help ;;
    *) mn_err "unknown command $cmd"; mn_help >&2; exit 2 ;;
  esac
fi
