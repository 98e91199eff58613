#!/bin/sh
# run_fuzz.sh SRCDIR BUILDDIR SECONDS "READERS" - builds the reader fuzz
# harnesses with clang's libFuzzer, makes seed files with the built
# programs, and fuzzes each reader for SECONDS. Run through `make fuzz`
# (FUZZ_SECONDS, FUZZ_READERS, FUZZ_CC); never part of `make check`.
#
# Our code (core, io) is built with coverage, AddressSanitizer and UBSan;
# HDF5 is the system's library, uninstrumented, so inside it only crashes,
# hangs and absurd allocations show. libFuzzer runs in fork mode, which goes
# on after a crash; each crash, timeout or out-of-memory input is kept in
# BUILDDIR/tests/fuzz/out/<reader>/ and bucketed by the first stack frame
# outside the sanitizers. Prints, per reader: inputs tried, accepted,
# refused (one error, as intended), crashes, timeouts and out-of-memory.
set -u
src=$1
build=$2
secs=${3:-120}
readers=${4:-"model_file ckpt_index safetensors tokens tokenizer"}
cc=${FUZZ_CC:-clang}
out="$build/tests/fuzz"
obj="$out/obj"
mkdir -p "$obj"

probe="$obj/probe.c"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$probe"
if ! "$cc" -fsanitize=fuzzer "$probe" -o "$obj/probe" > /dev/null 2>&1; then
    echo "run_fuzz.sh: '$cc -fsanitize=fuzzer' does not link; install clang (apt-get install clang)" >&2
    exit 1
fi

# --- build
cflags="-I$src/src -I$src -I$build ${HDF5_CFLAGS:-$(pkg-config --cflags hdf5-mpich)} -D_GNU_SOURCE
-std=gnu11 -g -O1 -fno-omit-frame-pointer"
libs="${HDF5_LIBS:-$(pkg-config --libs hdf5-mpich)} -lxxhash -ljansson -lpcre2-8 -lm -pthread"
san="address,undefined"
objs=""
for f in src/core/error.c src/core/log.c src/core/dtype.c src/core/util.c src/core/spec.c \
    src/core/tmpfile.c src/core/hf_map.c src/model/gpt2_spec.c src/model/hf_json.c \
    io/h5/model_file.c io/h5/h5util.c io/h5/h5heap.c \
    io/ckpt/ckpt_writer.c io/ckpt/ckpt_index.c io/ckpt/ckpt_reader.c io/ckpt/ckpt_consolidate.c \
    io/ckpt/ckpt_summary.c io/ckpt/ckpt_direct.c io/ckpt/ckpt_path.c io/ckpt/ckpt_verify.c \
    io/ckpt/ckpt_commit.c io/ckpt/ckpt_attrs.c io/h5/checksum.c io/util/fileutil.c io/hf/safetensors.c \
    io/text/tokens.c io/text/tokenizer.c io/text/tokenizer_added.c io/text/tokenizer_encode.c \
    io/text/tokenizer_post.c io/util/json.c \
    tests/fuzz/fuzz_common.c; do
    o="$obj/$(echo "$f" | tr / _).o"
    # shellcheck disable=SC2086
    "$cc" $cflags -fsanitize=fuzzer-no-link,$san -c "$src/$f" -o "$o" || exit 1
    objs="$objs $o"
done
for r in $readers; do
    # shellcheck disable=SC2086
    "$cc" $cflags -fsanitize=fuzzer,$san "$src/tests/fuzz/fuzz_$r.c" $objs $libs \
        -o "$out/fuzz_$r" || exit 1
done

# --- seeds, made by the programs under test
seeds="$out/seeds"
rm -rf "$seeds"
mkdir -p "$seeds/model_file" "$seeds/ckpt_index" "$seeds/safetensors" "$seeds/tokens" \
    "$seeds/tokenizer" "$seeds/work"
w="$seeds/work"
sh "$src/tests/corpus.sh" 20000 > "$w/text"
ok=1
"$build/fsdpc-data" tokenize "$w/text" -o "$w/train.bin" > /dev/null &&
    "$build/fsdpc-ckpt" init --layers 1 --heads 2 --width 8 --context 8 --seed 1 -o "$w/m.h5" \
    > /dev/null &&
    "$build/fsdpc-ckpt" init --layers 1 --heads 2 --width 8 --context 8 --untied --dtype bf16 \
    -o "$seeds/model_file/untied_bf16.h5" > /dev/null &&
    FSDPC_LOG=error "$build/fsdpc-train" --model "$w/m.h5" --data "$w/train.bin" --seq-len 8 \
    --batch-size 2 --steps 2 --lr 1e-3 --warmup 1 --ckpt-dir "$w/ck" --ckpt-every 2 > /dev/null &&
    "$build/fsdpc-ckpt" reshard "$w/ck/step_2" --world-size 2 -o "$w/s2" > /dev/null 2>&1 &&
    "$build/fsdpc-ckpt" export-safetensors "$w/m.h5" -o "$seeds/safetensors/m.safetensors" \
    > /dev/null || ok=0
# hand-made tokenizer.json files, GPT-2 style (the helper needs only the
# standard library), with and without merges honoured and a prefix space
for v in "tiny.json" "tiny-im.json --ignore-merges" "tiny-ps.json --prefix-space"; do
    # shellcheck disable=SC2086
    set -- $v
    f=$1
    shift
    "${PYTHON3:-python3}" "$src/tests/io/hf_tokenizer.py" tiny "$seeds/tokenizer/$f" "$@" || ok=0
done
if [ $ok -ne 1 ]; then
    echo "run_fuzz.sh: making the seed files failed" >&2
    exit 1
fi
cp "$w/m.h5" "$seeds/model_file/tied_f32.h5"
cp "$w/s2/index.h5" "$seeds/ckpt_index/index.h5"
head -c 4096 "$w/train.bin" > "$seeds/tokens/short.bin"
cp "$w/train.bin" "$seeds/tokens/train.bin"
# the header of a short file must say how many tokens it holds
"${PYTHON3:-python3}" - "$seeds/tokens/short.bin" <<'PY' || exit 1
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[8:12] = struct.pack("<i", (len(b) - 1024) // 2)
open(p, "wb").write(b)
PY

# --- fuzz
summary="$out/summary.txt"
: > "$summary"
for r in $readers; do
    arts="$out/out/$r"
    corpus="$out/corpus/$r"
    rm -rf "$arts"
    mkdir -p "$arts" "$corpus"
    stats="$out/stats.$r"
    rm -f "$stats".*
    echo "fuzzing $r for $secs s ..."
    dict="" # keys and values a reader's format is made of, where a dictionary helps
    [ -f "$src/tests/fuzz/$r.dict" ] && dict="-dict=$src/tests/fuzz/$r.dict"
    # fork-mode jobs end without exit handlers: their scratch dirs go here
    scratch="$out/tmp"
    rm -rf "$scratch"
    mkdir -p "$scratch"
    # shellcheck disable=SC2086
    TMPDIR="$scratch" FSDPC_FUZZ_STATS="$stats" FSDPC_FUZZ_CKPT="$w/s2" \
        ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=0 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$out/fuzz_$r" $dict -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -max_len=131072 \
        -artifact_prefix="$arts/" "$corpus" "$seeds/$r" > "$out/log.$r" 2>&1
    tried=$(grep -o '^#[0-9]*' "$out/log.$r" | tail -n 1 | tr -d '#')
    acc=$(cat "$stats".* 2> /dev/null | awk '{a += $1} END {print a + 0}')
    ref=$(cat "$stats".* 2> /dev/null | awk '{r += $2} END {print r + 0}')
    nc=$(find "$arts" -name 'crash-*' | wc -l)
    nt=$(find "$arts" -name 'timeout-*' | wc -l)
    no=$(find "$arts" -name 'oom-*' | wc -l)
    line="$r: ${tried:-0} inputs tried, $acc accepted, $ref refused (counted every 16 inputs per job), $nc crashes, $nt timeouts, $no out of memory"
    echo "$line" | tee -a "$summary"
    # bucket each kept input by the first frame of ours or HDF5's in its report
    for a in "$arts"/crash-* "$arts"/timeout-* "$arts"/oom-*; do
        [ -e "$a" ] || continue
        TMPDIR="$scratch" FSDPC_FUZZ_CKPT="$w/s2" ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
            timeout 30 "$out/fuzz_$r" -timeout=20 "$a" > "$a.log" 2>&1
        f=$(grep -E '^ +#[0-9]+ .* in ' "$a.log" |
            grep -v -E 'fuzzer::|__interceptor_|__sanitizer|sanitizer_common|__asan|__ubsan|__memcpy|__memmove| in (abort|raise|gsignal|__pthread_kill|__libc_message|__fortify_fail|__chk_fail|malloc|calloc|realloc|free|memcpy|memmove|memset|strlen|H5MM_|H5FL_)' |
            head -n 1 | sed -E 's/.* in ([^ ]+).*/\1/')
        # what ASan or libFuzzer called it
        k=$(grep -m 1 -o -E 'ERROR: (AddressSanitizer|libFuzzer): [A-Za-z-]+|buffer overflow detected|runtime error' "$a.log" |
            sed -E 's/ERROR: [A-Za-z]+: //; s/ /-/g')
        grep -q -E '^ +#[0-9]+ ' "$a.log" || k=not-reproduced-alone
        echo "${a##*/}" | cut -d- -f1 | tr '\n' ' '
        echo "${k:-?} in ${f:-?}"
    done | sort | uniq -c | sed 's/^/    /' | tee -a "$summary"
    rm -rf "$scratch"
done
echo "summary in $summary; inputs kept in $out/out/"
