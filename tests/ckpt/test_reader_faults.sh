#!/bin/sh
# test_reader_faults.sh - the file readers against inputs that used to hang,
# crawl or mislead: a FIFO (or a directory) given as a model file,
# checkpoint index, shard, safetensors or token file is refused at once;
# names and attributes carrying terminal escapes are printed made harmless;
# 80000 safetensors names open in well under a second (the duplicate check
# was quadratic); a safetensors file naming lm_head twice (with and without
# "transformer.") is refused; a huge safetensors header costs a small
# multiple of its size in memory; a damaged HDF5 global heap, which HDF5
# 1.10 would loop on forever or read past, is refused before HDF5 sees it,
# and so are collections overlapping each other (checking them was quadratic);
# list --quick, which reads a checkpoint's index alone, checks it too.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

train 1 --batch-size 4 --steps 2 --ckpt-dir "$W/ck" --ckpt-every 2 &&
    "$CKPT" reshard "$W/ck/step_2" --world-size 2 -o "$W/s2" > /dev/null 2>&1 &&
    "$CKPT" export-safetensors "$W/m.h5" -o "$W/a.st" > /dev/null 2>&1
tap_ok $? "fixtures: a 2-shard checkpoint and a safetensors export"

# one_line NAME PATTERN CMD...: CMD ends within 20 s, non-zero, with one
# stderr line matching PATTERN
one_line() {
    name=$1
    pat=$2
    shift 2
    timeout 20 "$@" > "$W/out" 2> "$W/err"
    rc=$?
    n=$(grep -c . "$W/err")
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
        tap_diag "$name: $* -> rc $rc ($([ $rc -eq 124 ] && echo hung)), $n lines: $(head -c 400 "$W/err")"
        return 1
    fi
    return 0
}

# --- FIFOs and other non-regular files
mkfifo "$W/fifo.h5" "$W/fifo.st" "$W/fifo.bin"
ok=0
one_line "model file" "fifo.h5: not a regular file (a FIFO)" "$CKPT" inspect "$W/fifo.h5" || ok=1
one_line "convert" "fifo.h5: not a regular file" "$CKPT" convert "$W/fifo.h5" --dtype bf16 \
    -o "$W/c.h5" || ok=1
# shellcheck disable=SC2086
one_line "train --model" "fifo.h5: not a regular file" "$TRAIN" $COMMON --model "$W/fifo.h5" \
    --batch-size 4 --steps 3 || ok=1
one_line "safetensors" "fifo.st: not a regular file" "$CKPT" import-safetensors "$W/fifo.st" \
    -o "$W/i.h5" || ok=1
one_line "token file" "fifo.bin: not a regular file" "$BIN/fsdpc-data" inspect "$W/fifo.bin" || ok=1
# shellcheck disable=SC2086
one_line "train --data" "fifo.bin: not a regular file" "$TRAIN" $COMMON --data "$W/fifo.bin" \
    --batch-size 4 --steps 3 || ok=1
tap_ok $ok "a FIFO as model file, safetensors or token file: refused at once with one line"

cp -r "$W/s2" "$W/fidx" && rm "$W/fidx/index.h5" && mkfifo "$W/fidx/index.h5"
cp -r "$W/s2" "$W/fsh" && rm "$W/fsh/shard_1.h5" && mkfifo "$W/fsh/shard_1.h5"
cp -r "$W/s2" "$W/dsh" && rm "$W/dsh/shard_1.h5" && mkdir "$W/dsh/shard_1.h5"
ok=0
for d in fidx fsh dsh; do
    case $d in
    fidx) pat="fidx/index.h5: not a regular file (a FIFO)" ;;
    fsh) pat="fsh/shard_1.h5: not a regular file (a FIFO)" ;;
    dsh) pat="dsh/shard_1.h5: not a regular file (a directory)" ;;
    esac
    one_line "$d verify" "$pat" "$CKPT" verify "$W/$d" || ok=1
    one_line "$d inspect index.h5" "$pat" "$CKPT" inspect "$W/$d/index.h5" || ok=1
    # shellcheck disable=SC2086
    one_line "$d resume" "$pat" "$TRAIN" $COMMON --batch-size 4 --steps 3 --resume "$W/$d" || ok=1
done
# shellcheck disable=SC2086
one_line "fsh --model index.h5" "maps source file './shard_1.h5', which is not a regular file" \
    "$TRAIN" $COMMON --model "$W/fsh/index.h5" --batch-size 4 --steps 3 || ok=1
tap_ok $ok "a FIFO or directory as index.h5 or shard: verify, inspect, --resume, --model refuse it"

# --- damaged HDF5 global heaps (where variable-length strings live), on
# which HDF5 1.10 itself loops forever or copies past its buffer
# heap_variants FILE PREFIX: PREFIX_loop.h5 and PREFIX_over.h5, FILE with its
# first collection damaged
heap_variants() {
    "$PY" - "$1" "$2" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
o = b.find(b"GCOL")
size = struct.unpack_from("<Q", b, o + 8)[0]
p, objs = o + 16, []
while p + 16 <= o + size:
    idx, osz = struct.unpack_from("<H", b, p)[0], struct.unpack_from("<Q", b, p + 8)[0]
    objs.append((idx, p))
    if idx == 0:
        break
    p += 16 + ((osz + 7) & ~7)
def variant(name, at, value):
    c = bytearray(b)
    struct.pack_into("<Q", c, at + 8, value)
    open(sys.argv[2] + name, "wb").write(c)
variant("_loop.h5", [p for i, p in objs if i == 0][0], 0)   # free space of 0 bytes
variant("_over.h5", [p for i, p in objs if i > 0][0], 1 << 30)  # an object past the heap
PY
}
heap_variants "$W/m.h5" "$W/heap"
ok=0
one_line "heap loop" "heap_loop.h5: damaged HDF5 global heap: free space of 0 bytes" \
    "$CKPT" inspect "$W/heap_loop.h5" || ok=1
one_line "heap overrun" "heap_over.h5: damaged HDF5 global heap: an object of 1073741824 bytes" \
    "$CKPT" inspect "$W/heap_over.h5" || ok=1
tap_diag "$(cat "$W/err")"
tap_ok $ok "a global heap HDF5 would loop on or read past: refused before HDF5 reads it"

# the same in a checkpoint's index.h5, read by list --quick (the index alone)
mkdir -p "$W/hl" && cp -r "$W/s2" "$W/hl/step_2" && heap_variants "$W/s2/index.h5" "$W/iheap" &&
    cp "$W/iheap_loop.h5" "$W/hl/step_2/index.h5" &&
    timeout 20 "$CKPT" list --quick "$W/hl" > "$W/hl.out" 2>&1
r=$?
grep -q "index.h5: damaged HDF5 global heap: free space of 0 bytes" "$W/hl.out" || r=1
[ $r -eq 0 ] || tap_diag "rc $r: $(head -c 600 "$W/hl.out")"
tap_ok $r "list --quick on a checkpoint whose index.h5 has a heap HDF5 would loop on: refused, no hang"

# 4 MiB of collections, each claiming the rest of the file (every walk over
# most of the file: this took minutes to check); a 20 s bound is ample for
# the linear check (tests/io/test_h5_heaps counts its work)
"$PY" - "$W/heap_overlap.h5" <<'PY'
import struct, sys
size = 4 << 20
b = bytearray(size)
b[0:8] = b"\x89HDF\r\n\x1a\n"
b[13] = b[14] = 8
for u in range(512, size, 32):
    struct.pack_into("<4sB3xQ4sB3xQ", b, u, b"GCOL", 1, 16, b"GCOL", 1, size - u - 16)
open(sys.argv[1], "wb").write(b)
PY
one_line "heap overlap" "heap_overlap.h5: damaged HDF5 global heap: collections overlap" \
    "$CKPT" inspect "$W/heap_overlap.h5"
tap_ok $? "4 MiB of overlapping heap collections: refused within 20 s, one line"

# --- a reader given a link to some other file (a secret one) refuses it
# without quoting its bytes: the safetensors header length was its first 8
# bytes as a number, a token file's bad magic its first 4
{ printf 'SECRETPW; another line of the secret\n' && head -c 2000 /dev/zero; } > "$W/secret"
mkdir -p "$W/sym" && cp -r "$W/s2" "$W/sym/ck" && rm "$W/sym/ck/shard_1.h5" &&
    for f in a.safetensors t.bin tokenizer.json m.h5 ck/shard_1.h5; do
        ln -s "$W/secret" "$W/sym/$f" || exit 1
    done
printf 'abc' > "$W/sym/text"
# the first 4 and 8 bytes as little-endian integers, signed and unsigned
nums=$("$PY" -c 'import struct, sys; b = open(sys.argv[1], "rb").read()
print(*struct.unpack("<iIqQ", b[:4] + b[:4] + b[:8] + b[:8]))' "$W/secret")
ok=0
for c in "import-safetensors $W/sym/a.safetensors -o $W/sym/x.h5" "inspect $W/sym/m.h5" \
    "verify $W/sym/ck" "data inspect $W/sym/t.bin" \
    "data tokenize --tokenizer $W/sym/tokenizer.json $W/sym/text -o $W/sym/x.bin"; do
    # shellcheck disable=SC2086
    case $c in
    data*) set -- "$BIN/fsdpc-data" ${c#data } ;;
    *) set -- "$CKPT" $c ;;
    esac
    "$@" > /dev/null 2> "$W/err"
    rc=$?
    leak=$(grep -o -e SECRET -e 'another line' "$W/err")
    for x in $nums; do
        grep -q -- "$x" "$W/err" && leak="$leak $x"
    done
    if [ $rc -eq 0 ] || [ "$(grep -c . "$W/err")" -ne 1 ] || [ -n "$leak" ]; then
        tap_diag "$c: rc $rc, quoted '$leak': $(cat "$W/err")"
        ok=1
    fi
done
tap_diag "$(cat "$W/err")"
tap_ok $ok "links to a foreign file as safetensors, model, shard, token file, tokenizer.json: refused, none of its bytes quoted"

# --- terminal escapes in names and attributes
# clean FILE...: no control byte (but newline) and no byte >= 0x80
clean() {
    "$PY" - "$@" <<'PY'
import sys
for p in sys.argv[1:]:
    b = open(p, "rb").read()
    bad = [i for i, c in enumerate(b) if (c < 0x20 and c != 0x0a) or c >= 0x7f]
    if bad:
        print("%s: byte 0x%02x at %d: %r" % (p, b[bad[0]], bad[0], b[max(0, bad[0] - 30):bad[0] + 10]))
        sys.exit(1)
PY
}

if have_h5py; then
    cp "$W/m.h5" "$W/esc_extra.h5" && cp "$W/m.h5" "$W/esc_arch.h5" && cp -r "$W/s2" "$W/esc_ck" &&
        "$PY" - "$W" > "$W/esc.out" 2>&1 <<'PY'
import sys, h5py, numpy as np
w = sys.argv[1]
evil = "\x1b]2;owned\x07\x1b[2J\r\u009b31m"
with h5py.File(w + "/esc_extra.h5", "r+") as f:
    f["model"].create_dataset(evil + "x", data=np.zeros(4, "f4"))
with h5py.File(w + "/esc_arch.h5", "r+") as f:
    f.attrs["architecture"] = "gpt" + evil
with h5py.File(w + "/esc_ck/index.h5", "r+") as f:
    del f.attrs["xxh3_64_attrs"]  # as an index from before them: read unchecked, and printed
    f.attrs["config"] = "lr = 1\nnote = " + evil + "\nsteps = 2\n"
    f.attrs["created_by"] = "made by " + evil
    f.attrs["mesh"] = "dp=2" + evil
PY
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$W/esc.out")"
    ok=$r
    "$CKPT" inspect "$W/esc_extra.h5" > "$W/e1.out" 2> "$W/e1.err"
    [ $? -ne 0 ] && grep -q "unexpected entry /model/" "$W/e1.err" && clean "$W/e1.out" "$W/e1.err" || ok=1
    "$CKPT" inspect "$W/esc_arch.h5" > "$W/e2.out" 2> "$W/e2.err"
    [ $? -ne 0 ] && grep -q "attribute 'architecture' is 'gpt" "$W/e2.err" &&
        clean "$W/e2.out" "$W/e2.err" || ok=1
    "$CKPT" inspect "$W/esc_ck" > "$W/e3.out" 2> "$W/e3.err"
    [ $? -eq 0 ] && grep -q "note = " "$W/e3.out" && grep -q "created by    made by " "$W/e3.out" &&
        clean "$W/e3.out" "$W/e3.err" || ok=1
    tap_diag "$(cat "$W/e1.err" "$W/e2.err"; grep -e "note =" -e "created by" -e "mesh" "$W/e3.out")"
    tap_ok $ok "HDF5 names and attributes with escape sequences are printed with them replaced"
else
    tap_skip_dep h5py "not importable by /usr/bin/python3 (escapes in HDF5 names)"
fi

"$PY" - "$W/a.st" "$W/esc" > "$W/st.out" 2>&1 <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
evil = "\u001b]2;owned\u0007\u001b[2J\r"
def write(path, h, body=data):
    b = json.dumps(h).encode()
    open(path, "wb").write(struct.pack("<Q", len(b)) + b + body)
L = len(data)
h = json.loads(json.dumps(hdr))
h["transformer.h.0.mlp.c_gate" + evil] = {"dtype": "U8", "shape": [0], "data_offsets": [L, L]}
write(sys.argv[2] + "_unknown.st", h)
h = json.loads(json.dumps(hdr))
h["transformer.wte.weight"]["dtype"] = "F8" + evil
write(sys.argv[2] + "_dtype.st", h)
h = json.loads(json.dumps(hdr))
h["__metadata__"]["fsdpc_ln_eps"] = "1e-5" + evil
write(sys.argv[2] + "_eps.st", h)
# a name twice, written as raw JSON (a dict cannot hold it twice)
e = json.dumps("x" + evil) + ':{"dtype":"U8","shape":[0],"data_offsets":[%d,%d]}' % (L, L)
b = (json.dumps(hdr)[:-1] + "," + e + "," + e + "}").encode()
open(sys.argv[2] + "_dup.st", "wb").write(struct.pack("<Q", len(b)) + b + data)
PY
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/st.out")"
ok=$r
for v in unknown:"unexpected tensor 'transformer.h.0.mlp.c_gate" dtype:"has dtype 'F8" \
    eps:"metadata fsdpc_ln_eps '1e-5" dup:"appears twice"; do
    k=${v%%:*}
    one_line "$k" "${v#*:}" "$CKPT" import-safetensors "$W/esc_$k.st" -o "$W/esc.h5" &&
        clean "$W/out" "$W/err" || ok=1
    tap_diag "$(cat "$W/err")"
done
tap_ok $ok "safetensors names, dtypes and metadata with escape sequences are printed with them replaced"

# --- 80000 names: the duplicate check and lookups are not quadratic
"$PY" - "$W/many.st" <<'PY'
import struct, sys
n = 80000
parts = ['"t%06d":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}' % (i, i, i + 1)
         for i in range(n)]
parts.append('"t%06d":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}' % (n - 1, n, n + 1))
h = ("{" + ",".join(parts) + "}").encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"\0" * (n + 1))
PY
t0=$(date +%s.%N)
one_line "80k names" "tensor 't079999' appears twice" "$CKPT" import-safetensors "$W/many.st" \
    -o "$W/many.h5"
r=$?
t1=$(date +%s.%N)
secs=$(echo "$t0 $t1" | awk '{printf "%.3f", $2 - $1}')
tap_diag "80001 names, the last a duplicate: refused in $secs s"
[ $r -eq 0 ] && awk -v s="$secs" 'BEGIN { exit !(s < 5) }'
tap_ok $? "80000 safetensors names: the duplicate is found in under 5 s ($secs s)"

# --- lm_head.weight under both spellings
"$PY" - "$W/a.st" "$W/twohead.st" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h, data = json.loads(raw[8:8 + n]), raw[8 + n:]
s, e = h["transformer.wte.weight"]["data_offsets"]
wte = data[s:e]
other = bytes(len(wte))  # a second, different head
for name, body in (("lm_head.weight", other), ("transformer.lm_head.weight", wte)):
    h[name] = {"dtype": "F32", "shape": h["transformer.wte.weight"]["shape"],
               "data_offsets": [len(data), len(data) + len(body)]}
    data += body
b = json.dumps(h).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(b)) + b + data)
PY
one_line "two heads" "both 'transformer.lm_head.weight' and 'lm_head.weight' are present" \
    "$CKPT" import-safetensors "$W/twohead.st" -o "$W/twohead.h5" && [ ! -e "$W/twohead.h5" ]
r=$?
tap_diag "$(cat "$W/err")"
tap_ok $r "lm_head.weight and transformer.lm_head.weight both present: refused, nothing written"

# --- memory of a large header: 1,000,000 metadata entries (about 14 MB of JSON)
if /usr/bin/time -f %M true > /dev/null 2>&1; then
    "$PY" - "$W/meta.st" "$W/tiny.st" <<'PY'
import struct, sys
def write(path, n):
    m = ",".join('"k%d":"v"' % i for i in range(n))
    h = ('{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{%s}}' % m).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"\0")
write(sys.argv[1], 1000000)
write(sys.argv[2], 1)
PY
    /usr/bin/time -o "$W/rss0" -f %M "$CKPT" import-safetensors "$W/tiny.st" -o "$W/t.h5" \
        > /dev/null 2>&1
    /usr/bin/time -o "$W/rss1" -f %M "$CKPT" import-safetensors "$W/meta.st" -o "$W/t.h5" \
        > /dev/null 2>&1
    hb=$(($(wc -c < "$W/meta.st") - 9))
    kb0=$(tail -n 1 "$W/rss0")
    kb1=$(tail -n 1 "$W/rss1")
    ratio=$(echo "$kb0 $kb1 $hb" | awk '{printf "%.1f", ($2 - $1) * 1024 / $3}')
    tap_diag "header of $hb bytes: peak RSS $kb1 KiB against $kb0 KiB for a tiny one: $ratio x the header"
    awk -v r="$ratio" 'BEGIN { exit !(r < 6) }'
    tap_ok $? "a 14 MB safetensors header costs less than 6 times its size ($ratio x)"
else
    tap_skip_dep "GNU time" "not installed (peak RSS of a large header)"
fi

tap_done
