#!/bin/sh
# check_lengths.sh TOP [ALLOWED] - prints every function over 80 lines and
# every .c file over 900 lines in TOP's src/, io/ and backends/, one
# "file:function: N lines" or "file: N lines" line each, and exits 1 when
# one of them is not in ALLOWED, when ALLOWED lists one that is no longer
# over (so the list only ever shrinks), or when ALLOWED holds more than 5
# functions or more than 5 files.
#
# The code is clang-formatted in the Linux brace style, so a function is
# found by its shape: it starts at a line that begins with a lower-case
# letter and holds '(' (the first line of its signature), whose '{' sits
# alone at column 0, and it ends at the next '}' at column 0. Its length
# counts both ends.
#
# ALLOWED: one entry a line, "file:function" or "file", then '#' and why;
# lines that start with '#' are comments.
top=${1:?usage: check_lengths.sh TOP [ALLOWED]}
allowed=${2:-}
FUNC_MAX=80
FILE_MAX=900
ALLOWED_MAX=5
case "$allowed" in
'' | /*) ;;
*) allowed="$PWD/$allowed" ;; # read after the cd below
esac
cd "$top" || exit 2

tmp=$(mktemp "${TMPDIR:-/tmp}/fsdpc-lengths.XXXXXX") || exit 2
trap 'rm -f "$tmp" "$tmp.allowed"' EXIT

# "file:function N" for every function over FUNC_MAX, "file N" for every file over FILE_MAX
for f in $(find src io backends -name '*.c' 2>/dev/null | LC_ALL=C sort); do
    awk -v max="$FUNC_MAX" '
        /^[a-z].*\(/ { sig = $0; first = FNR }
        /^\{/ && sig != "" { name = sig; sub(/\(.*/, "", name); n = split(name, w, /[ *]+/);
                             name = w[n]; infn = 1 }
        /^\}/ && infn { if (FNR - first + 1 > max) print FILENAME ":" name " " FNR - first + 1;
                        infn = 0; sig = "" }
        END { if (FNR > 900) print FILENAME " " FNR }' "$f"
done >"$tmp"

: >"$tmp.allowed"
if [ -n "$allowed" ]; then
    sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$allowed" >"$tmp.allowed"
fi

rc=0
while read -r what n; do
    case "$what" in
    *:*) limit=$FUNC_MAX ;;
    *) limit=$FILE_MAX ;;
    esac
    if grep -qxF "$what" "$tmp.allowed"; then
        echo "$what: $n lines (over $limit; allowed)"
    else
        echo "$what: $n lines (over $limit)"
        rc=1
    fi
done <"$tmp"

while read -r what; do
    if ! awk -v w="$what" '$1 == w { found = 1 } END { exit !found }' "$tmp"; then
        echo "$what is listed in $allowed but is no longer over its limit: strike it from the list"
        rc=1
    fi
done <"$tmp.allowed"

nf=$(grep -c ':' "$tmp.allowed")
nfiles=$(grep -vc ':' "$tmp.allowed")
if [ "$nf" -gt "$ALLOWED_MAX" ] || [ "$nfiles" -gt "$ALLOWED_MAX" ]; then
    echo "$allowed lists $nf functions and $nfiles files: at most $ALLOWED_MAX of each"
    rc=1
fi
exit $rc
