#!/bin/sh
# quickstart.sh - set up a fresh Debian 12 machine, build fsdpc, and run the
# demo or the test suite.
#
#   ./quickstart.sh demo    install what is missing, build, train the tiny
#                           built-in model on a corpus made from this source
#                           tree with 2 sharded ranks, then print a sample
#   ./quickstart.sh test    install what is missing, build, run `make check`
#                           and print "N passed, N failed, N skipped"
#   ./quickstart.sh build   install and build only
#
# Builds out of tree in ./build (override with BUILD_DIR). What apt-get and
# the build print goes to BUILD_DIR/quickstart.log; the terminal gets one
# line per phase (and the end of the log when a phase fails). Uses MPICH
# explicitly (mpicc.mpich / mpiexec.mpich): Debian's generic mpicc may point
# to Open MPI once other packages are installed.
set -eu

cd "$(dirname "$0")"
SRC=$(pwd)
BUILD_DIR=${BUILD_DIR:-$SRC/build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$BUILD_DIR"
LOG=$BUILD_DIR/quickstart.log
: > "$LOG"

# phase NAME CMD...: CMD's output into the log, one line on the terminal
phase() {
    p_name=$1
    shift
    p_t0=$(date +%s)
    echo "== quickstart: $p_name ..." >> "$LOG"
    if "$@" >> "$LOG" 2>&1; then
        echo "quickstart: $p_name: done in $(( $(date +%s) - p_t0 )) s"
    else
        echo "quickstart: $p_name: FAILED; the end of $LOG:" >&2
        tail -n 20 "$LOG" >&2
        exit 1
    fi
}

PKGS_BUILD="build-essential autoconf automake libtool pkg-config mpich libmpich-dev \
libhdf5-mpich-dev hdf5-tools libopenblas-dev libssl-dev libxxhash-dev libpcre2-dev libjansson-dev \
python3"
# the tests also compare against PyTorch, read files with h5py, draw curves
# with fsdpc-plot (matplotlib), and run the Slurm job scripts on a one-node
# Slurm cluster of their own
PKGS_TEST="python3-torch python3-h5py python3-numpy python3-matplotlib slurmctld slurmd slurm-client munge"
# and Hugging Face's tokenizers (pip, into $BUILD_DIR/hf-venv: hf_venv below)
PKGS_TEST="$PKGS_TEST python3-venv"

install_missing() {
    missing=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
    done
    if [ -z "$missing" ]; then
        echo "quickstart: packages: all $# present"
        return 0
    fi
    echo "quickstart: packages: installing$missing (apt-get's output: $LOG)"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    phase "apt-get update" $SUDO apt-get update -q
    phase "apt-get install" $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends $missing
}

build() {
    if [ ! -x "$SRC/configure" ] || [ "$SRC/configure.ac" -nt "$SRC/configure" ]; then
        phase "autogen" "$SRC/autogen.sh"
    fi
    cd "$BUILD_DIR"
    [ -f Makefile ] || phase "configure" "$SRC/configure" -q
    phase "build (make -j$JOBS in $BUILD_DIR)" make -s -j"$JOBS"
    cd "$SRC"
}

# Adds up automake's test-suite.log counts (every TAP line is one test).
summary() {
    passed=0 failed=0 skipped=0
    for log in "$@"; do
        if [ ! -f "$log" ]; then
            echo "quickstart: $log missing: that test run did not start" >&2
            failed=$((failed + 1))
            continue
        fi
        count() { v=$(sed -n "s/^# $1: *//p" "$log" | head -n 1); echo "${v:-0}"; }
        passed=$((passed + $(count PASS) + $(count XFAIL)))
        failed=$((failed + $(count FAIL) + $(count ERROR) + $(count XPASS)))
        skipped=$((skipped + $(count SKIP)))
    done
    # checks skipped because a test dependency is missing (tap_skip_dep):
    # named here, and under CI (which installs every dependency) failures
    deps=$(for log in "$@"; do
        [ -f "$log" ] && sed -n 's/.*# SKIP missing dependency: \([^ ]*\).*/\1/p' \
            "$(dirname "$log")"/tests/*/*.log 2>/dev/null
    done | sort | uniq -c | awk '{ printf "%s%s x%d", sep, $2, $1; sep = ", " }')
    if [ -n "$deps" ]; then
        ndep=$(echo "$deps" | tr ',' '\n' | sed 's/.* x//' | awk '{ n += $1 } END { print n }')
        echo "quickstart: WARNING: $ndep checks did not run because a test dependency is missing: $deps"
        if [ "${CI:-}" = true ]; then
            echo "quickstart: CI installs every test dependency: counting these $ndep as failed"
            failed=$((failed + ndep))
            skipped=$((skipped - ndep))
        fi
    fi
    echo "${passed} passed, ${failed} failed, ${skipped} skipped"
    [ "$failed" -eq 0 ]
}

# Tests that feed bad files and flags to the programs, rebuilt under
# AddressSanitizer/UBSan: a crash or a leak there fails the run.
SAN_TESTS="tests/io/test_model_file tests/io/test_tokens tests/io/test_ckpt_tool.sh tests/io/test_data_tool.sh tests/ckpt/test_ckpt_bad.sh tests/ckpt/test_safetensors.sh"
SAN_TESTS="$SAN_TESTS tests/io/test_tokenizer.sh tests/io/test_checksum tests/ckpt/test_checksums.sh tests/ckpt/test_hf_dir.sh"
SAN_TESTS="$SAN_TESTS tests/io/test_h5_heaps"
sanitizer_check() {
    san="$BUILD_DIR-asan"
    mkdir -p "$san"
    cd "$san"
    [ -f Makefile ] || "$SRC/configure" -q --enable-asan --disable-native CFLAGS="-g -O1"
    rc=0
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        FSDPC_HF_PYTHON="${FSDPC_HF_PYTHON:-$BUILD_DIR/hf-venv/bin/python}" \
        make -j"$JOBS" check TESTS="$SAN_TESTS" >"$san/check.out" 2>&1 || rc=$?
    cd "$SRC"
    return $rc
}

# The release tarball (make dist): every file git tracks is in it (but the
# repository's own dotfiles), and it configures, builds and passes a few
# quick tests, so a file left out of the Makefile lists fails here.
DIST_TESTS="tests/kernels/test_device tests/train/test_train_options tests/layers/test_layers.sh"
dist_check() {
    d="$BUILD_DIR-dist"
    rm -rf "$d"
    mkdir -p "$d"
    cd "$BUILD_DIR"
    rc=0
    make distdir distdir="$d/tree" >"$d/dist.out" 2>&1 || rc=1
    if [ $rc -eq 0 ] && git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$SRC" ls-files | grep -v -e '^\.' -e '/\.gitignore$' | sort >"$d/tracked"
        (cd "$d/tree" && find . -type f | sed 's|^\./||' | sort) >"$d/shipped"
        comm -23 "$d/tracked" "$d/shipped" >"$d/missing"
        if [ -s "$d/missing" ]; then
            echo "quickstart: the release tarball lacks $(wc -l <"$d/missing") tracked files (add them to a local.mk list):"
            sed 's/^/  /' "$d/missing"
            rc=1
        fi
    fi
    if [ $rc -eq 0 ]; then
        mkdir -p "$d/tree/b"
        cd "$d/tree/b"
        { ../configure -q && make -s -j"$JOBS" && make -j"$JOBS" check TESTS="$DIST_TESTS"; } \
            >"$d/check.out" 2>&1 || rc=1
        [ $rc -eq 0 ] || echo "quickstart: the release tarball does not build and pass its smoke tests: see $d/check.out"
    fi
    cd "$SRC"
    return $rc
}

# The tokenizer tests compare with Hugging Face's `tokenizers`: transformers
# 4.38.2 (tokenizers 0.15.2) from PyPI into a venv of Debian's Python, made
# once; without a network the checks that need it skip, and say so.
hf_venv() {
    venv="$BUILD_DIR/hf-venv"
    "$venv/bin/python" -c 'import tokenizers' 2>/dev/null && return 0
    rm -rf "$venv"
    if /usr/bin/python3 -m venv --system-site-packages "$venv" >"$BUILD_DIR/hf-venv.log" 2>&1 &&
        "$venv/bin/pip" install -q transformers==4.38.2 >>"$BUILD_DIR/hf-venv.log" 2>&1; then
        echo "quickstart: made $venv (transformers 4.38.2)"
    else
        rm -rf "$venv"
        echo "quickstart: pip could not install transformers into $venv (no network?): the tokenizer checks that compare with it will skip (see $BUILD_DIR/hf-venv.log)"
    fi
}

case "${1:-}" in
demo)
    install_missing $PKGS_BUILD
    build
    BIN="$BUILD_DIR" WORK="${WORK:-$SRC/demo}" exec "$SRC/jobscripts/local/demo.sh"
    ;;
test)
    install_missing $PKGS_BUILD $PKGS_TEST
    build
    hf_venv
    cd "$BUILD_DIR"
    rc=0
    make -j"$JOBS" check >"$BUILD_DIR/check.out" 2>&1 || rc=$?
    cd "$SRC"
    sanitizer_check || rc=1
    dist_check || rc=1
    # what did not pass, with the failing checks' own lines
    for out in "$BUILD_DIR/check.out" "$BUILD_DIR-asan/check.out"; do
        grep -E '^(FAIL|ERROR|SKIP|XPASS):' "$out" 2>/dev/null | head -n 100 || true
    done
    for log in $(grep -l -E '^(FAIL|ERROR)' "$BUILD_DIR"/tests/*/*.log "$BUILD_DIR-asan"/tests/*/*.log 2>/dev/null | head -n 10); do
        echo "---- $log"
        tail -n 30 "$log"
    done
    summary "$BUILD_DIR/test-suite.log" "$BUILD_DIR-asan/test-suite.log" \
        "$BUILD_DIR-dist/tree/b/test-suite.log" || rc=1
    exit $rc
    ;;
build)
    install_missing $PKGS_BUILD
    build
    echo "quickstart: built in $BUILD_DIR"
    ;;
*)
    echo "usage: $0 demo|test|build" >&2
    exit 2
    ;;
esac
