#!/bin/sh
# test_cuda_nvcc.sh - every CUDA kernel source (src/compute/cuda/*.cu)
# compiles with nvcc for sm_80 and sm_90 with every warning an error, and
# every one is among the sources that test_cuda_emu runs under the host
# emulation. The nvcc checks skip when configure found no CUDA toolkit
# (NVCC empty): the default build never needs nvcc.
. "$top_srcdir/tests/tap.sh"

dir="$top_srcdir/src/compute/cuda"
missing=
for f in "$dir"/*.cu; do
    b=$(basename "$f")
    grep -q "^#include \"compute/cuda/$b\"" "$top_srcdir/tests/kernels/cuda_emu_kernels.cpp" ||
        missing="$missing $b"
done
[ -z "$missing" ]
tap_ok $? "every kernel source is tested under the emulation${missing:+ (not:$missing)}"

if [ -z "$NVCC" ]; then
    tap_skip "nvcc: configure found no CUDA toolkit"
    tap_done
    exit
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-nvcc.XXXXXX")
trap 'rm -rf "$W"' EXIT
for f in "$dir"/*.cu; do
    b=$(basename "$f" .cu)
    "$NVCC" -std=c++17 -I"$top_srcdir/src" -I"$top_srcdir" -I"$top_builddir" \
        -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
        -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
        -c "$f" -o "$W/$b.o" >"$W/$b.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && tap_diag "$(head -n 20 "$W/$b.log")"
    tap_ok $rc "nvcc -Werror, sm_80 and sm_90: $b.cu"
done
tap_done
