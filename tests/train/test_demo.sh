#!/bin/sh
# test_demo.sh - jobscripts/local/demo.sh (what `quickstart.sh demo` runs),
# shortened to 10 steps on one rank: it succeeds, what it prints fits on one
# screen (at most 24 lines) while the trainer's whole output is in
# train.log, and its validation text is every 20th source file, so it comes
# from across the corpus rather than from its end.
. "$top_srcdir/tests/tap.sh"

W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-demo.XXXXXX")
trap 'rm -rf "$W"' EXIT

BIN="$top_builddir" WORK="$W/demo" STEPS=10 RANKS=1 THREADS=1 \
    sh "$top_srcdir/jobscripts/local/demo.sh" > "$W/out" 2>&1
rc=$?
n=$(wc -l < "$W/out")
[ $rc -eq 0 ] && [ "$n" -le 24 ] && grep -q '^done: 10 steps in ' "$W/out" &&
    grep -q '^# fsdpc-train .* configuration' "$W/demo/train.log" &&
    ! grep -q '^# fsdpc-train' "$W/out"
r=$?
tap_diag "$(cat "$W/out")"
tap_ok $r "demo.sh with 10 steps: $n lines on the terminal, the trainer's whole output in train.log (rc $rc)"

# the held-out text is exactly the files at positions 10, 30, 50, ... of the list
awk 'NR % 20 == 10' "$W/demo/files.txt" > "$W/held"
: > "$W/expect"
while IFS= read -r f; do cat "$f" >> "$W/expect"; done < "$W/held"
total=$(wc -l < "$W/demo/files.txt")
last=$(awk 'NR % 20 == 10 { n = NR } END { print n }' "$W/demo/files.txt")
[ -s "$W/expect" ] && cmp -s "$W/expect" "$W/demo/val.txt" && [ "$last" -gt $((total - 20)) ]
tap_ok $? "validation text: every 20th of $total files, the last at position $last (not the corpus's last part)"

tap_done
