#!/bin/sh
# kit.sh - builds, on a machine with the development packages (MPICH, HDF5,
# OpenBLAS, the CUDA toolkit; no GPU needed), the GPU kit: one archive that
# holds fsdpc's programs, the test programs worth running on a GPU, every
# shared library they need except the C library's own and CUDA's, a wrapper
# that runs them against those libraries only, and the GPU checks
# (run_gpu_checks.sh). A bare GPU machine with a CUDA driver and CUDA's
# libraries (the toolkit's lib64, or a Python's nvidia wheels) unpacks and
# runs it: nothing there is built or installed.
#
# The build is a separate, git-ignored build directory, configured with
# --with-cuda, --disable-native (the GPU machine's CPU is another) and, when
# configure has it, --enable-cuda-kernels (the `--device cuda` kernels),
# for the GPU targets in NVCC_ARCH (default sm_90 only: the H200 and H100).
# Then the kit is unpacked into a scratch directory and checked here: every
# library it needs resolves inside it (or is the C library's, or CUDA's),
# `fsdpc-train --help` and a 2-step CPU training of a tiny model run through
# its wrapper in an emptied environment.
#
# Usage: tests/gpu/kit.sh [-b BUILD] [-o ARCHIVE] [-j JOBS] [-n]
#   -b BUILD    build directory (default: build-gpu-kit at the top of the source)
#   -o ARCHIVE  the kit (default: BUILD/fsdpc-gpu-kit.tar.gz)
#   -j JOBS     parallel make jobs (default 2)
#   -n          do not check the kit after packing it
# Environment:
#   NVCC_ARCH       nvcc -gencode flags (default: sm_90 only)
#   CONFIGURE_ARGS  extra configure arguments
#   KIT_MAX_MIB     the largest kit allowed (default 40)
#
# Exit status: 0 when the kit was built, is under KIT_MAX_MIB and passed its
# checks; 1 otherwise.

set -u

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$src/build-gpu-kit
archive=
jobs=2
check=1
while getopts "b:o:j:n" opt; do
    case $opt in
    b) build=$OPTARG ;;
    o) archive=$OPTARG ;;
    j) jobs=$OPTARG ;;
    n) check=0 ;;
    *) echo "usage: $0 [-b BUILD] [-o ARCHIVE] [-j JOBS] [-n]" >&2; exit 2 ;;
    esac
done
NVCC_ARCH=${NVCC_ARCH:-"-gencode arch=compute_90,code=sm_90"}
KIT_MAX_MIB=${KIT_MAX_MIB:-40}
name=fsdpc-gpu-kit

# the programs, and the test programs that need a real GPU (the others run
# under emulation here)
programs="fsdpc-train fsdpc-sample fsdpc-ckpt fsdpc-data fsdpc-bench"
gpu_tests="tests/backends/test_nccl"

# Libraries the kit never carries: the C library's (every Linux has its
# own, and it must match the dynamic loader), and CUDA's (they must match
# the GPU machine's driver; it has them). The C++ runtime goes to lib/compat,
# used only where the machine has none of its own.
glibc_re='^(linux-vdso|linux-gate|ld-linux|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libnsl|libanl)\.so'
cuda_re='^lib(cuda|cudart|cublas|cublasLt|nccl|nvidia-ml|nvrtc|nvJitLink|cudnn|cufft|curand|cusparse|cusolver)\.so'
compat_re='^lib(stdc\+\+|gcc_s)\.so'

die() {
    echo "kit.sh: $*" >&2
    exit 1
}

mkdir -p "$build" || die "cannot create $build"
build=$(cd "$build" && pwd)
archive=${archive:-$build/$name.tar.gz}

# -- configure and build -----------------------------------------------------
if [ ! -x "$src/configure" ]; then
    sh "$src/autogen.sh" >"$build/autogen.log" 2>&1 || die "autogen.sh failed: see $build/autogen.log"
fi
[ -f "$src/config.status" ] &&
    die "$src is configured in place; run 'make distclean' there first (the kit builds out of tree)"
kernels=
"$src/configure" --help | grep -q -- '--enable-cuda-kernels' && kernels=--enable-cuda-kernels
# shellcheck disable=SC2086 # CONFIGURE_ARGS is a list of arguments
set -- --with-cuda --disable-native $kernels ${CONFIGURE_ARGS:-}
want="$* NVCC_ARCH=$NVCC_ARCH"
cd "$build" || exit 1
if [ ! -f config.status ] || [ "$(cat kit-configure-args 2>/dev/null)" != "$want" ]; then
    echo "kit.sh: configure $want"
    "$src/configure" "$@" NVCC_ARCH="$NVCC_ARCH" >configure.log 2>&1 ||
        die "configure failed: see $build/configure.log"
    echo "$want" >kit-configure-args
fi
tests=
for t in $gpu_tests; do
    grep -q "^$t\$(EXEEXT):" Makefile && tests="$tests $t"
done
echo "kit.sh: make -j$jobs $programs$tests"
# shellcheck disable=SC2086 # lists of targets
make -j"$jobs" $programs $tests >make.log 2>&1 || die "make failed: see $build/make.log"
have_kernels=$(sed -n 's/^#define HAVE_CUDA_KERNELS \([01]\)$/\1/p' config.h)
have_nccl=$(sed -n 's/^#define HAVE_NCCL \([01]\)$/\1/p' config.h)

# -- stage: bin/ (wrappers), libexec/ (the programs), lib/ ---------------------
stage=$build/kit-stage
kit=$stage/$name
rm -rf "$stage"
mkdir -p "$kit/bin" "$kit/libexec" "$kit/lib/compat" "$kit/tests" "$kit/share" || exit 1
for p in $programs $tests; do
    if ! cp "$p" "$kit/libexec/" || ! strip "$kit/libexec/$(basename "$p")"; then
        die "cannot copy $p"
    fi
done
# every library the programs load, but the C library's and CUDA's
for f in "$kit"/libexec/*; do
    ldd "$f"
done >"$stage/ldd"
grep 'not found' "$stage/ldd" && die "a library is missing here"
awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' "$stage/ldd" | sort -u >"$stage/needed"
cuda_libs=
while read -r soname path; do
    if echo "$soname" | grep -Eq "$glibc_re"; then
        continue
    elif echo "$soname" | grep -Eq "$cuda_re"; then
        cuda_libs="$cuda_libs $soname"
    elif echo "$soname" | grep -Eq "$compat_re"; then
        cp -L "$path" "$kit/lib/compat/$soname" || exit 1
    else
        cp -L "$path" "$kit/lib/$soname" && strip --strip-unneeded "$kit/lib/$soname" || exit 1
    fi
done <"$stage/needed"
# UCX (MPICH's transport) looks for its modules in ucx/ beside libucs; the
# shared-memory one (cma) is all a one-machine run needs
ucs=$(awk '$1 ~ /^libucs\.so/ { print $2 }' "$stage/needed")
if [ -n "$ucs" ] && [ -d "$(dirname "$ucs")/ucx" ]; then
    mkdir -p "$kit/lib/ucx"
    m=$(dirname "$ucs")/ucx/libuct_cma.so.0
    [ -e "$m" ] && cp -L "$m" "$kit/lib/ucx/"
fi
for p in $tests; do
    mv "$kit/libexec/$(basename "$p")" "$kit/tests/"
done

# the wrapper: bin/NAME runs libexec/NAME with the kit's environment
cat >"$kit/env.sh" <<'EOF'
# env.sh - sourced with kit set to the kit's directory: the kit's libraries
# first, then CUDA's (FSDPC_KIT_CUDA_LIBS: the directories run_gpu_checks.sh
# found them in), then the C++ runtime of lib/compat where the machine has
# no libstdc++ of its own.
kit_path=$kit/lib${FSDPC_KIT_CUDA_LIBS:+:$FSDPC_KIT_CUDA_LIBS}
if ! { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | grep -q 'libstdc++\.so\.6 '; then
    kit_path=$kit_path:$kit/lib/compat
fi
LD_LIBRARY_PATH=$kit_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
UCX_MODULE_DIR=$kit/lib/ucx
export LD_LIBRARY_PATH UCX_MODULE_DIR
EOF
cat >"$kit/bin/wrapper" <<'EOF'
#!/bin/sh
# runs the kit's program of this link's name with the kit's libraries
kit=$(cd "$(dirname "$0")/.." && pwd)
. "$kit/env.sh"
exec "$kit/libexec/$(basename "$0")" "$@"
EOF
chmod +x "$kit/bin/wrapper"
for p in $programs; do
    ln -s wrapper "$kit/bin/$p"
done
cp "$here/run_gpu_checks.sh" "$src/tests/corpus.sh" "$kit/" || exit 1
[ -f "$src/tests/peers/torch_gpt2_bench.py" ] && cp "$src/tests/peers/torch_gpt2_bench.py" "$kit/share/"

# what the kit is, for run_gpu_checks.sh and for people
glibc_max=$(find "$kit/libexec" "$kit/tests" "$kit/lib" -type f -exec objdump -T {} + 2>/dev/null |
    sed -n 's/.*GLIBC_\([0-9.]*\).*/\1/p' | sort -u -t. -k1,1n -k2,2n -k3,3n | tail -n 1)
{
    echo "kit=$name"
    echo "source=$(git -C "$src" describe --always --dirty 2>/dev/null || echo unknown)"
    echo "built=$(date -u '+%Y-%m-%dT%H:%M:%SZ') on $(uname -m)"
    echo "configure=$want"
    echo "cuda_kernels=$( [ "$have_kernels" = 1 ] && echo yes || echo no)"
    echo "nccl=$( [ "$have_nccl" = 1 ] && echo yes || echo no)"
    echo "cuda_libs=${cuda_libs# }"
    echo "glibc_min=$glibc_max"
    echo "programs=$programs"
    echo "tests=$(for t in $tests; do basename "$t"; done | tr '\n' ' ')"
} >"$kit/KIT_INFO"

tar -C "$stage" -czf "$archive" "$name" || die "cannot write $archive"
bytes=$(wc -c <"$archive")
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "kit.sh: $archive: $mib MiB ($(find "$kit/lib" -type f | wc -l) libraries)"
sed 's/^/    /' "$kit/KIT_INFO"
[ "$bytes" -le $((KIT_MAX_MIB * 1048576)) ] || die "the kit is over $KIT_MAX_MIB MiB"
[ $check -eq 1 ] || exit 0

# -- check it: unpacked elsewhere, in an emptied environment -----------------
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-kit-check.XXXXXX")
trap 'rm -rf "$T"' EXIT
tar -C "$T" -xzf "$archive" || die "cannot unpack $archive"
k=$T/$name
failed=0
ok() {
    if [ "$1" -eq 0 ]; then
        echo "kit.sh: ok    $2"
    else
        echo "kit.sh: FAIL  $2"
        failed=1
    fi
}
# each library resolves inside the kit, or is the C library's or CUDA's
bad=$(for f in "$k"/libexec/* "$k"/tests/*; do
    env -i LD_LIBRARY_PATH="$k/lib:$k/lib/compat" ldd "$f"
done | awk '$2 == "=>" { print $1, $3 }' | sort -u | while read -r soname path; do
    case $path in "$k"/*) continue ;; esac
    echo "$soname" | grep -Eq "$glibc_re|$cuda_re" || echo "$soname ($path)"
done)
[ -z "$bad" ] || echo "$bad" | sed 's/^/    from outside the kit: /'
ok "$([ -z "$bad" ]; echo $?)" "every library but the C library's and CUDA's comes from the kit"
kenv() {
    env -i PATH=/usr/bin:/bin HOME="$T" "$@"
}
kenv "$k/bin/fsdpc-train" --help >"$T/help" 2>&1
ok $? "fsdpc-train --help through the wrapper"
grep -A3 -- '--device' "$T/help" | sed 's/^/    /'
sh "$k/corpus.sh" 30000 >"$T/text"
kenv "$k/bin/fsdpc-data" tokenize "$T/text" -o "$T/train.bin" >"$T/log" 2>&1 &&
    kenv "$k/bin/fsdpc-ckpt" init --preset tiny -o "$T/tiny.h5" >>"$T/log" 2>&1
ok $? "fixtures: fsdpc-data tokenize, fsdpc-ckpt init --preset tiny"
kenv FSDPC_LOG=warn "$k/bin/fsdpc-train" --model "$T/tiny.h5" --data "$T/train.bin" \
    --device cpu --steps 2 --batch-size 2 --seq-len 32 --lr 1e-3 --peak-flops 1e12 \
    --metrics "$T/m.jsonl" >>"$T/log" 2>&1
ok $? "a 2-step CPU training of the tiny GPT-2 through the wrapper"
[ "$(grep -c '"loss"' "$T/m.jsonl" 2>/dev/null)" -eq 2 ]
ok $? "its metrics hold 2 steps"
[ $failed -eq 0 ] || tail -n 20 "$T/log"
echo "kit.sh: the kit needs from the GPU machine:$cuda_libs" \
    "(the CUDA toolkit's lib64 or python3's nvidia wheels), glibc >= $glibc_max"
exit $failed
