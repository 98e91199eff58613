# tap.sh - TAP helpers for shell tests (sourced).
#   tap_ok COND_EXIT_STATUS "description"; tap_skip "why"; tap_done
#   tap_skip_dep WHAT "why": a skip because a test dependency (h5py, torch,
#   an MPI launcher, ...) is missing. quickstart.sh's summary names these
#   loudly, and under CI=true counts each as a failure: a check that did not
#   run because its dependency was not installed has not passed.
tap_n=0
tap_failed=0
tap_ok() {
    tap_n=$((tap_n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $tap_n - $2"
    else
        echo "not ok $tap_n - $2"
        tap_failed=$((tap_failed + 1))
    fi
}
tap_skip() {
    tap_n=$((tap_n + 1))
    echo "ok $tap_n # SKIP $1"
}
tap_skip_dep() {
    tap_skip "missing dependency: $1 ($2)"
}
tap_diag() {
    echo "$@" | sed 's/^/# /'
}
tap_done() {
    echo "1..$tap_n"
    [ "$tap_failed" -eq 0 ]
}
