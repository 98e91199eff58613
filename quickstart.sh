#!/bin/sh
# quickstart.sh - set up a fresh Debian 12 machine, build fsdpc, and run the
# demo or the test suite.
#
#   ./quickstart.sh demo    install what is missing, build, train the tiny
#                           built-in model on a corpus made from this source
#                           tree (2 ranks), then print a sample
#   ./quickstart.sh test    install what is missing, build, run `make check`
#                           and print "N passed, N failed, N skipped"
#   ./quickstart.sh build   install and build only
#
# Builds out of tree in ./build (override with BUILD_DIR). Uses MPICH
# explicitly (mpicc.mpich / mpiexec.mpich): Debian's generic mpicc may point
# to Open MPI once other packages are installed.
set -eu

cd "$(dirname "$0")"
SRC=$(pwd)
BUILD_DIR=${BUILD_DIR:-$SRC/build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

PKGS_BUILD="build-essential autoconf automake libtool pkg-config mpich libmpich-dev \
libhdf5-mpich-dev hdf5-tools libopenblas-dev python3"
# the tests also compare against PyTorch and read files with h5py
PKGS_TEST="python3-torch python3-h5py python3-numpy"

install_missing() {
    missing=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    echo "quickstart: installing:$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
}

build() {
    if [ ! -x "$SRC/configure" ] || [ "$SRC/configure.ac" -nt "$SRC/configure" ]; then
        "$SRC/autogen.sh"
    fi
    mkdir -p "$BUILD_DIR"
    cd "$BUILD_DIR"
    [ -f Makefile ] || "$SRC/configure" -q
    make -s -j"$JOBS"
    cd "$SRC"
}

summary() {
    log="$BUILD_DIR/test-suite.log"
    if [ ! -f "$log" ]; then
        echo "quickstart: no test-suite.log: the test run did not start" >&2
        echo "0 passed, 1 failed"
        return 1
    fi
    pass=$(sed -n 's/^# PASS: *//p' "$log" | head -n 1)
    fail=$(sed -n 's/^# FAIL: *//p' "$log" | head -n 1)
    err=$(sed -n 's/^# ERROR: *//p' "$log" | head -n 1)
    xpass=$(sed -n 's/^# XPASS: *//p' "$log" | head -n 1)
    xfail=$(sed -n 's/^# XFAIL: *//p' "$log" | head -n 1)
    skip=$(sed -n 's/^# SKIP: *//p' "$log" | head -n 1)
    passed=$(( ${pass:-0} + ${xfail:-0} ))
    failed=$(( ${fail:-0} + ${err:-0} + ${xpass:-0} ))
    # failing tests' logs, so CI output shows why
    if [ "$failed" -ne 0 ]; then
        grep -E '^(FAIL|ERROR|XPASS):' "$log" | head -n 50 || true
    fi
    echo "${passed} passed, ${failed} failed, ${skip:-0} skipped"
    [ "$failed" -eq 0 ]
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
    cd "$BUILD_DIR"
    rc=0
    make -j"$JOBS" check >"$BUILD_DIR/check.out" 2>&1 || rc=$?
    grep -E '^(PASS|FAIL|ERROR|SKIP|XFAIL|XPASS):' "$BUILD_DIR/check.out" | grep -v '^PASS' | head -n 200 || true
    summary || rc=1
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
