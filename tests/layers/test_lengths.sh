#!/bin/sh
# test_lengths.sh - no function over 80 lines and no .c file over 900 in
# src/, io/ and backends/ beyond the short list in lengths_allowed.txt; and
# the check does fail on a planted long function, an unlisted long file, a
# listed one that is no longer long, and a list of more than 5.
. "$top_srcdir/tests/tap.sh"

CHECK="$top_srcdir/tests/layers/check_lengths.sh"
ALLOWED="$top_srcdir/tests/layers/lengths_allowed.txt"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-lengths.XXXXXX")
trap 'rm -rf "$W"' EXIT

out=$(sh "$CHECK" "$top_srcdir" "$ALLOWED" 2>&1)
rc=$?
[ $rc -eq 0 ] || tap_diag "$out"
tap_ok $rc "no function over 80 lines, no file over 900, beyond lengths_allowed.txt ($(grep -vc '^#' "$ALLOWED") left)"

# fn NAME BODY_LINES: a function of BODY_LINES + 3 lines (signature, braces)
fn() {
    printf 'static int %s(int x)\n{\n' "$1"
    fn_k=0
    while [ $fn_k -lt "$2" ]; do
        printf '    x += %d;\n' $fn_k
        fn_k=$((fn_k + 1))
    done
    printf '}\n\n'
}
mkdir -p "$W/t/src/core" "$W/t/io" "$W/t/backends/tcp"
{ fn short 10; fn edge 77; } > "$W/t/src/core/a.c"
sh "$CHECK" "$W/t" > "$W/out" 2>&1
tap_ok $? "a tree of short functions passes (80 lines exactly is not over)"
fn long 78 > "$W/t/io/b.c"
sh "$CHECK" "$W/t" > "$W/out" 2>&1
rc=$?
grep -q "^io/b.c:long: 81 lines (over 80)$" "$W/out"
[ $rc -ne 0 ] && [ $? -eq 0 ]
tap_ok $? "a planted 81-line function fails and is named with its length"
printf 'io/b.c:long  # planted\n' > "$W/allowed"
sh "$CHECK" "$W/t" "$W/allowed" > "$W/out" 2>&1
tap_ok $? "the same function passes when it is listed as allowed"
fn long 10 > "$W/t/io/b.c"
sh "$CHECK" "$W/t" "$W/allowed" > "$W/out" 2>&1
rc=$?
grep -q "no longer over its limit" "$W/out"
[ $rc -ne 0 ] && [ $? -eq 0 ]
tap_ok $? "an allowed function that is short again fails until the list shrinks"
i=0
while [ $i -lt 70 ]; do fn "f$i" 10; i=$((i + 1)); done > "$W/t/backends/tcp/c.c"
sh "$CHECK" "$W/t" > "$W/out" 2>&1
rc=$?
grep -q "^backends/tcp/c.c: 980 lines (over 900)$" "$W/out"
[ $rc -ne 0 ] && [ $? -eq 0 ]
tap_ok $? "a 980-line file fails and is named"
for i in 1 2 3 4 5 6; do printf 'src/x%d.c  # many\n' $i; done > "$W/allowed"
printf 'backends/tcp/c.c  # big\n' >> "$W/allowed"
sh "$CHECK" "$W/t" "$W/allowed" > "$W/out" 2>&1
rc=$?
grep -q "at most 5 of each" "$W/out"
[ $rc -ne 0 ] && [ $? -eq 0 ]
tap_ok $? "an allow-list of more than 5 files fails"

tap_done
