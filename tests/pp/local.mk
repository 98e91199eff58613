# tests/pp: the pipeline runtime. The message order around each pass
# against rendezvous sends; pipeline runs of llama-tiny (gpipe, 1f1b; pp=2,
# pp=4, pp=2 x dp=2 over mixed backends) against one rank on the same
# global batch, with the executed order and the held inputs checked
# against the schedule's table and bound.
check_PROGRAMS += tests/pp/pp_table
PROGRAM_TESTS += tests/pp/test_pp_comm
dist_check_SCRIPTS += tests/pp/test_pp_equiv.sh
# the bytes between stages against the analytical volume
dist_check_SCRIPTS += tests/pp/test_pp_bytes.sh
# the idle share per rank at pp=4 with synthetic passes, run by hand (doc/performance.md)
EXTRA_DIST += tests/pp/run_pp_bubble.sh
