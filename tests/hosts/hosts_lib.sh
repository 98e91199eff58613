# hosts_lib.sh - N hosts on one machine, for tests of jobs that span hosts
# (sourced). Each host is a network namespace with its own host name (a UTS
# namespace per command), one interface eth0 with addresses 10.77.0.<i>/24
# and fd77::<i>/64, and a loopback; the hosts meet on a bridge inside a namespace of its own,
# so their traffic never leaves the namespaces made here. Needs root and
# `ip netns` (iproute2): hosts_up skips the whole test, with the reason,
# where either is missing or namespaces are not allowed.
#
#   hosts_up N              make hosts 1..N (host names fsdpc-host<i>)
#   host_run I CMD ARGS...  run CMD on host I (in the foreground)
#   host_ip I               "10.77.0.<I>"
#   host_kill I             SIGKILL every process of host I
#   hosts_down              kill what runs on them and remove them (on EXIT)

HOSTS_PREFIX="fsdpc$$"
HOSTS_N=0

hosts_skip() {
    tap_skip "namespaced hosts unavailable: $1"
    tap_done
    exit 0
}

hosts_up() {
    [ "$(id -u)" = 0 ] || hosts_skip "not root (network namespaces need it)"
    command -v ip > /dev/null 2>&1 || hosts_skip "no ip command (iproute2)"
    command -v unshare > /dev/null 2>&1 || hosts_skip "no unshare command (util-linux)"
    trap 'hosts_down' EXIT
    ip netns add "$HOSTS_PREFIX-sw" 2> "$T/netns.err" ||
        hosts_skip "ip netns add failed: $(cat "$T/netns.err")"
    ip -n "$HOSTS_PREFIX-sw" link add br0 type bridge &&
        ip -n "$HOSTS_PREFIX-sw" link set br0 up || hosts_skip "cannot make a bridge"
    i=1
    while [ "$i" -le "$1" ]; do
        ns="$HOSTS_PREFIX-h$i"
        ip netns add "$ns" &&
            ip link add "f$$a$i" type veth peer name "f$$b$i" &&
            ip link set "f$$a$i" netns "$ns" &&
            ip link set "f$$b$i" netns "$HOSTS_PREFIX-sw" &&
            ip -n "$ns" link set "f$$a$i" name eth0 &&
            ip -n "$ns" addr add "10.77.0.$i/24" dev eth0 &&
            ip -n "$ns" addr add "fd77::$i/64" dev eth0 nodad &&
            ip -n "$ns" link set eth0 up &&
            ip -n "$ns" link set lo up &&
            ip -n "$HOSTS_PREFIX-sw" link set "f$$b$i" master br0 &&
            ip -n "$HOSTS_PREFIX-sw" link set "f$$b$i" up || hosts_skip "cannot wire host $i"
        HOSTS_N=$i
        i=$((i + 1))
    done
    # host 1 reaches the others (a refused connection to port 9 is an answer)
    i=2
    while [ "$i" -le "$HOSTS_N" ]; do
        host_run 1 "$PY" -c "import socket, sys; s = socket.socket(); s.settimeout(2)
sys.exit(0 if s.connect_ex(('10.77.0.$i', 9)) in (0, 111) else 1)" ||
            hosts_skip "host 1 cannot reach host $i over the bridge"
        i=$((i + 1))
    done
}

host_ip() {
    echo "10.77.0.$1"
}

host_run() {
    h=$1
    shift
    ip netns exec "$HOSTS_PREFIX-h$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' \
        "fsdpc-host$h" "$@"
}

host_kill() {
    for p in $(ip netns pids "$HOSTS_PREFIX-h$1" 2> /dev/null); do
        kill -9 "$p" 2> /dev/null
    done
}

hosts_down() {
    i=1
    while [ "$i" -le "$HOSTS_N" ]; do
        host_kill "$i"
        ip netns del "$HOSTS_PREFIX-h$i" 2> /dev/null
        i=$((i + 1))
    done
    ip netns del "$HOSTS_PREFIX-sw" 2> /dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
