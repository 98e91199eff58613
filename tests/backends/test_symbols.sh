#!/bin/sh
# test_symbols.sh - what the backends' objects define at global scope: every
# global symbol in backends/<be>/*.o carries the prefix fsdp_<be>_, and all of
# them but the ops struct fsdp_<be>_ops are hidden (FSDP_PRIVATE), so that a
# backend's internals can collide neither with another backend nor with the
# libraries it wraps (MPI owns mpi_, NCCL nccl*). A backend that configure
# left out (nccl without CUDA) has no objects and is skipped. The check must
# also fail on a planted unprefixed symbol and on an exported one.
. "$top_srcdir/tests/tap.sh"

NM=${NM:-nm}
READELF=${READELF:-readelf}
OBJCOPY=${OBJCOPY:-objcopy}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-symbols.XXXXXX")
trap 'rm -rf "$W"' EXIT

# check_backend DIR BE: prints one line per offending symbol of DIR/*.o.
check_backend() {
    for o in "$1"/*.o; do
        [ -e "$o" ] || continue
        "$NM" -g --defined-only "$o" | awk -v o="$o" -v p="fsdp_$2_" \
            'NF >= 3 && index($3, p) != 1 { print o ": " $3 ": lacks the prefix " p }'
        "$READELF" -sW "$o" | awk -v o="$o" -v ops="fsdp_$2_ops" \
            '($5 == "GLOBAL" || $5 == "WEAK") && $7 != "UND" && $6 == "DEFAULT" && $8 != ops {
                print o ": " $8 ": exported; only " ops " may be (mark it FSDP_PRIVATE)" }'
    done
}

# compiled BE: whether configure put backend BE into this build.
compiled() {
    case "$1" in
    nccl) grep -q '^#define HAVE_NCCL 1' "$top_builddir/config.h" ;;
    *) return 0 ;;
    esac
}

for tool in "$NM" "$READELF" "$OBJCOPY"; do
    if ! command -v "$tool" > /dev/null 2>&1; then
        tap_skip_dep "$tool" "binutils"
        tap_done
        exit $?
    fi
done

for src in "$top_srcdir"/backends/*/; do
    be=$(basename "$src")
    dir="$top_builddir/backends/$be"
    if ! ls "$dir"/*.o > /dev/null 2>&1; then
        if compiled "$be"; then
            tap_ok 1 "$be: backend is configured but $dir holds no objects (run make first)"
        else
            tap_skip "$be: not compiled in this build (no objects in backends/$be)"
        fi
        continue
    fi
    out=$(check_backend "$dir" "$be")
    [ -z "$out" ] || tap_diag "$out"
    [ -z "$out" ]
    tap_ok $? "$be: every global carries fsdp_${be}_ and only fsdp_${be}_ops is exported"
done

# The check itself: planted symbols in copies of real objects must be named.
mkdir -p "$W/tcp" "$W/mpi"
"$OBJCOPY" --redefine-sym fsdp_tcp_algo_select=tcp_algo_select \
    "$top_builddir/backends/tcp/tcp_algo.o" "$W/tcp/tcp_algo.o"
out=$(check_backend "$W/tcp" tcp)
echo "$out" | grep -q "tcp_algo_select: lacks the prefix fsdp_tcp_"
tap_ok $? "a planted global without the backend's prefix is named"
"$OBJCOPY" --redefine-sym fsdp_mpi_ops=fsdp_mpi_table \
    "$top_builddir/backends/mpi/mpi_ops.o" "$W/mpi/mpi_ops.o"
out=$(check_backend "$W/mpi" mpi)
echo "$out" | grep -q "fsdp_mpi_table: exported"
tap_ok $? "a planted exported symbol other than the ops struct is named"

tap_done
