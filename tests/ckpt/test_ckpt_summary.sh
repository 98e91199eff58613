#!/bin/sh
# test_ckpt_summary.sh - every shard file carries its summary (the root
# attribute ckpt_summary: each tensor's rows, where its bytes lie, the object
# its link points to, its checksums; doc/formats.md, "Shard summary"), and the
# readers trust it only as far as it holds:
#   - the rows read through it (pread at its offsets) are those HDF5 reads
#     through the datasets: consolidate and a resume give the same bytes and
#     losses with and without summaries, and a checkpoint without them (one
#     from before) still inspects, verifies and resumes;
#   - a damaged summary is refused by its own checksum, one that points a
#     tensor at other bytes (its checksum recomputed) fails the data's
#     checksums, and one of another shard is refused by its head, each in one
#     line naming the shard file;
#   - a dataset replaced after the shard was written (its link no longer
#     points where the summary says) gets the full check, which names it;
#   - large datasets are aligned and written with O_DIRECT: the same bytes
#     as through the page cache (FSDPC_CKPT_DIRECT=0), read back either way.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

if ! have_h5py; then
    tap_skip_dep h5py "not importable by /usr/bin/python3 (the variants are made with it)"
    tap_done
    exit 0
fi

# edit DIR SHARD ACTION: rewrite shard SHARD of DIR's summary (h5py, numpy):
# strip (remove it), flip (one word of a hash changed), offset (tensor 0 of
# kind 0 pointed 4 bytes further, the summary's own checksum recomputed),
# other:R (the summary of shard R put in its place), replace (model/wte.weight
# written again as a new dataset of the same values)
edit() {
    "$PY" - "$@" <<'PY'
import sys, h5py, numpy as np
d, shard, action = sys.argv[1], sys.argv[2], sys.argv[3]
path = "%s/shard_%s.h5" % (d, shard)

def xxh3(words):
    # the summary's last word: XXH3-64 of the words before it; recomputed
    # through the library fsdpc links, by way of ctypes
    import ctypes, ctypes.util
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash"))
    lib.XXH3_64bits.restype = ctypes.c_uint64
    buf = np.ascontiguousarray(words, dtype="<u8").tobytes()
    return lib.XXH3_64bits(buf, ctypes.c_size_t(len(buf)))

with h5py.File(path, "r+") as f:
    if action == "strip":
        del f.attrs["ckpt_summary"]
    elif action == "flip":
        w = np.array(f.attrs["ckpt_summary"], dtype="<u8")
        w[6 + 8] ^= np.uint64(1)  # the first hash of the first tensor
        f.attrs.modify("ckpt_summary", w)
    elif action == "offset":
        w = np.array(f.attrs["ckpt_summary"], dtype="<u8")
        w[6 + 3] += np.uint64(4)  # tensor 0's offset
        w[-1] = np.uint64(xxh3(w[:-1]))
        f.attrs.modify("ckpt_summary", w)
    elif action.startswith("other:"):
        with h5py.File("%s/shard_%s.h5" % (d, action[6:]), "r") as g:
            w = np.array(g.attrs["ckpt_summary"], dtype="<u8")
        del f.attrs["ckpt_summary"]
        f.attrs.create("ckpt_summary", w, dtype="<u8")
    elif action == "replace":
        # the old dataset kept under another name, so the new one cannot
        # take its place in the file (HDF5 reuses freed space)
        name = "model/wte.weight"
        data, attrs = f[name][...], dict(f[name].attrs)
        f.move(name, "wte_before")
        f.create_dataset(name, data=data, dtype="<f4")
        for k, v in attrs.items():
            f[name].attrs[k] = v
PY
}

train 2 --batch-size 4 --steps 2 --ckpt-dir "$W/ck" &&
    "$PY" -c '
import sys, h5py
for r in (0, 1):
    with h5py.File("%s/shard_%d.h5" % (sys.argv[1], r), "r") as f:
        w = f.attrs["ckpt_summary"]
        assert w[0] == 1 and w[1] == 2 and w[2] == r and w[3] == 2, list(w[:6])
' "$W/ck/step_2" && "$CKPT" verify "$W/ck/step_2" > /dev/null 2>&1
tap_ok $? "a 2-rank checkpoint: each shard carries its summary (version 1, step 2, shard r of 2); verify passes"

# the same checkpoint without summaries: read through HDF5, as before them
cp -r "$W/ck/step_2" "$W/plain" && edit "$W/plain" 0 strip && edit "$W/plain" 1 strip &&
    "$CKPT" inspect "$W/plain" > "$W/i_plain.out" 2>&1 &&
    "$CKPT" inspect "$W/ck/step_2" > "$W/i_sum.out" 2>&1 &&
    sed 1d "$W/i_plain.out" > "$W/a" && sed 1d "$W/i_sum.out" > "$W/b" && cmp -s "$W/a" "$W/b" &&
    "$CKPT" verify "$W/plain" > /dev/null 2>&1 &&
    "$CKPT" consolidate "$W/plain" --with-optimizer -o "$W/c_plain.h5" > /dev/null 2>&1 &&
    "$CKPT" consolidate "$W/ck/step_2" --with-optimizer -o "$W/c_sum.h5" > /dev/null 2>&1 &&
    "$PY" - "$W/c_plain.h5" "$W/c_sum.h5" > "$W/cmp.out" 2>&1 <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
assert len(names) > 20 and any(n.startswith("optim/") for n in names), names
for n in names:
    x, y = a[n][...], b[n][...]
    assert x.tobytes() == y.tobytes(), "%s differs: max abs %g" % (n, np.abs(x - y).max())
PY
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/cmp.out")"
tap_ok $r "without summaries: inspect prints the same, verify passes, consolidate gives the same tensors"

train 2 --batch-size 4 --steps 4 --resume "$W/plain" --metrics "$W/r_plain.jsonl" &&
    train 2 --batch-size 4 --steps 4 --resume "$W/ck/step_2" --metrics "$W/r_sum.jsonl" &&
    losses "$W/r_plain.jsonl" > "$W/l_plain" && losses "$W/r_sum.jsonl" > "$W/l_sum" &&
    [ "$(wc -l < "$W/l_sum")" -eq 2 ] && cmp -s "$W/l_plain" "$W/l_sum"
r=$?
[ $r -eq 0 ] || tap_diag "$(paste "$W/l_plain" "$W/l_sum")"
tap_ok $r "a 2-rank resume through the summaries continues with the losses of one without"

# refused NAME PATTERN DIR: inspect, verify and --resume fail with one line
refused() {
    ok=0
    for cmd in inspect verify resume; do
        case $cmd in
        resume)
            # shellcheck disable=SC2086
            "$TRAIN" $COMMON --batch-size 4 --steps 4 --resume "$3" > "$W/out" 2> "$W/err" ;;
        *) "$CKPT" $cmd "$3" > "$W/out" 2> "$W/err" ;;
        esac
        rc=$?
        n=$(grep -c . "$W/err")
        if [ $rc -eq 0 ] || [ "$n" -ne 1 ] || ! grep -q -- "$2" "$W/err"; then
            tap_diag "$1: $cmd: rc $rc, $n lines: $(head -c 600 "$W/err")"
            ok=1
        fi
    done
    tap_diag "$(cat "$W/err")"
    tap_ok $ok "$1: inspect, verify and --resume refuse it in one line"
}

cp -r "$W/ck/step_2" "$W/flip" && edit "$W/flip" 1 flip
refused "a flipped word" "flip/shard_1.h5: attribute 'ckpt_summary' does not match its own checksum" "$W/flip"

# the data is read where the summary says: 4 bytes off, the checksums fail
cp -r "$W/ck/step_2" "$W/off" && edit "$W/off" 0 offset &&
    "$CKPT" inspect "$W/off" > /dev/null 2>&1 &&
    ! "$CKPT" verify "$W/off" > "$W/out" 2> "$W/err" &&
    grep -q "off/shard_0.h5: tensor 'model/wte.weight' rows \[0, .*checksum mismatch" "$W/out"
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/out" "$W/err" | head -n 20)"
tap_ok $r "a tensor's offset moved (summary checksum recomputed): inspect passes, verify fails on its rows"

cp -r "$W/ck/step_2" "$W/other" && edit "$W/other" 1 other:0
refused "shard 0's summary in shard 1" "other/shard_1.h5: shard 0 of 2, expected 1 of 2" "$W/other"

cp -r "$W/ck/step_2" "$W/repl" && edit "$W/repl" 0 replace
refused "a dataset replaced after the shard was written" \
    "repl/shard_0.h5: /model/wte.weight is not the dataset the shard's summary records" "$W/repl"

# direct writes and reads (datasets of 64 KiB or more) against the page
# cache's (FSDPC_CKPT_DIRECT=0): the same tensors, the same resumed losses
# width 1100: rows of 4400 bytes and more (no dataset a whole number of 4 KiB blocks),
# the MLP over 8 MiB per shard (more than one buffer of direct writes)
"$CKPT" init --layers 1 --heads 4 --width 1100 --context 64 --seed 2 -o "$W/big.h5" > /dev/null 2>&1 &&
    train 2 --model "$W/big.h5" --batch-size 4 --steps 2 --ckpt-dir "$W/bd" &&
    (export FSDPC_CKPT_DIRECT=0 && train 2 --model "$W/big.h5" --batch-size 4 --steps 2 \
        --ckpt-dir "$W/bc") &&
    "$PY" - "$W/bd/step_2" > "$W/al.out" 2>&1 <<'PY'
import sys, h5py
big = 0
for r in (0, 1):
    with h5py.File("%s/shard_%d.h5" % (sys.argv[1], r), "r") as f:
        def see(n, o):
            global big
            if isinstance(o, h5py.Dataset) and o.size * 4 >= 65536:
                big += 1
                assert o.id.get_offset() % 4096 == 0, (n, o.id.get_offset())
        f.visititems(see)
assert big >= 6, big
PY
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/al.out" "$W/last.out" | tail -n 5)"
tap_ok $r "every dataset of 64 KiB or more starts at a multiple of 4096 bytes"

for d in bd bc; do
    "$CKPT" verify "$W/$d/step_2" > /dev/null 2>&1 &&
        "$CKPT" consolidate "$W/$d/step_2" --with-optimizer -o "$W/$d.h5" > /dev/null 2>&1 || r=1
done
[ "$r" -eq 0 ] && "$PY" - "$W/bd.h5" "$W/bc.h5" > "$W/cmp.out" 2>&1 <<'PY'
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
for n in names:
    assert a[n][...].tobytes() == b[n][...].tobytes(), n + " differs"
PY
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/cmp.out")"
tap_ok $r "written with O_DIRECT and through the page cache: both verify, the same tensors"

train 2 --model "$W/big.h5" --batch-size 4 --steps 4 --resume "$W/bd/step_2" --metrics "$W/rd.jsonl" &&
    (export FSDPC_CKPT_DIRECT=0 && train 2 --model "$W/big.h5" --batch-size 4 --steps 4 \
        --resume "$W/bd/step_2" --metrics "$W/rc.jsonl") &&
    losses "$W/rd.jsonl" > "$W/ld" && losses "$W/rc.jsonl" > "$W/lc" &&
    [ "$(wc -l < "$W/ld")" -eq 2 ] && cmp -s "$W/ld" "$W/lc"
r=$?
[ $r -eq 0 ] || tap_diag "$(paste "$W/ld" "$W/lc")"
tap_ok $r "a resume reading with O_DIRECT and one through the page cache: the same losses"

tap_done
