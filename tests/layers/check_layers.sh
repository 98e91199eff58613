#!/bin/sh
# check_layers.sh TOP [ALLOWED] - prints every #include in TOP's library code
# that reaches a layer above the including file's own (doc/design.md,
# "Layers"), one "file -> header" line each, and exits 1 when there is one
# that ALLOWED (a file of such lines) does not list, or when ALLOWED lists
# one that is gone (so the list only ever shrinks). Tests are not checked:
# they may include anything. Two more rules than the ranks: the
# parallelisms (src/parallel, src/tp) never include io/, as they never open files
# (the training layer reads and writes their state as row ranges); and inside io,
# whose files sit in one folder per concern, io/util (file helpers, JSON)
# includes no other io folder, as every other one builds on it.
top=${1:?usage: check_layers.sh TOP [ALLOWED]}
allowed=${2:-}
cd "$top" || exit 2

# folder -> rank, lowest first; a layer may include its own rank and below
layer_of() {
    case "$1" in
    src/core/*) echo 0 ;;
    io/util/* | io/h5/* | io/ckpt/* | io/hf/* | io/text/*) echo 1 ;;
    src/rendezvous/*) echo 2 ;;
    backends/*) echo 3 ;;
    src/comm/*) echo 4 ;;
    src/compute/*) echo 5 ;;
    src/tp/*) echo 6 ;;
    src/model/*) echo 7 ;;
    src/optim/*) echo 8 ;;
    src/parallel/*) echo 9 ;;
    src/train/*) echo 10 ;;
    src/programs/*) echo 11 ;;
    *) echo "" ;;
    esac
}

found=$(mktemp)
trap 'rm -f "$found"' EXIT
for f in $(find src io backends -name '*.[ch]' -o -name '*.cu' | sort); do
    lf=$(layer_of "$f")
    [ -n "$lf" ] || { echo "check_layers: $f is in no layer (add its folder to layer_of)" >&2; exit 2; }
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r h; do
        # headers are named from the top (src/ is on the include path)
        case "$h" in
        config.h) continue ;;
        backends/* | io/*) hp=$h ;;
        */*) hp=src/$h ;;
        *) continue ;; # same folder
        esac
        lh=$(layer_of "$hp")
        if [ -n "$lh" ] && [ "$lh" -gt "$lf" ]; then
            echo "$f -> $h"
        elif { [ "$lf" -eq 9 ] || [ "$lf" -eq 6 ]; } && [ "$lh" = 1 ]; then
            echo "$f -> $h"
        else
            case "$f:$h" in
            io/util/*:io/util/*) ;;
            io/util/*:io/*) echo "$f -> $h" ;;
            esac
        fi
    done
done > "$found"

rc=0
if [ -n "$allowed" ]; then
    want=$(grep -v '^#' "$allowed" | sed '/^[[:space:]]*$/d' | sort)
else
    want=""
fi
new=$(sort "$found" | comm -23 - "$(printf '%s\n' "$want" > "$found.want"; echo "$found.want")")
gone=$(sort "$found" | comm -13 - "$found.want")
rm -f "$found.want"
if [ -n "$new" ]; then
    echo "includes of a layer above (doc/design.md, Layers):"
    echo "$new" | sed 's/^/  /'
    rc=1
fi
if [ -n "$gone" ]; then
    echo "listed as allowed but no longer there (remove from the list):"
    echo "$gone" | sed 's/^/  /'
    rc=1
fi
exit $rc
