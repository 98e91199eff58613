# tests/ckpt: sharded checkpoints end to end (fsdpc-train save/resume, faults,
# fsdpc-ckpt subcommands, bad inputs).
dist_check_SCRIPTS += tests/ckpt/test_ckpt_resume.sh tests/ckpt/test_ckpt_faults.sh \
	tests/ckpt/test_ckpt_bad.sh tests/ckpt/test_safetensors.sh
dist_check_DATA += tests/ckpt/ckpt_lib.sh tests/ckpt/make_bad_st.py

# The commit protocol under a crash at every file-system call of a save
# (crash_shim wraps those calls; the library is static, so they land there),
# and as crash_shim.so preloaded into fsdpc-train by the end-to-end test.
check_PROGRAMS += tests/ckpt/crash_shim.so
PROGRAM_TESTS += tests/ckpt/test_ckpt_crash
tests_ckpt_test_ckpt_crash_SOURCES = tests/ckpt/test_ckpt_crash.c tests/ckpt/crash_shim.c \
	tests/ckpt/crash_shim.h
tests_ckpt_test_ckpt_crash_LDADD = $(LDADD) -ldl
tests_ckpt_crash_shim_so_SOURCES = tests/ckpt/crash_shim.c tests/ckpt/crash_shim.h
tests_ckpt_crash_shim_so_CFLAGS = $(AM_CFLAGS) -fPIC
tests_ckpt_crash_shim_so_LDFLAGS = -shared
tests_ckpt_crash_shim_so_LDADD = -ldl
dist_check_SCRIPTS += tests/ckpt/test_ckpt_rollback.sh

# Direct writes from the writer threads: through the wrapped pwrite, and a
# failed one (first, middle, last in flight) fails the save by name.
PROGRAM_TESTS += tests/ckpt/test_ckpt_direct
tests_ckpt_test_ckpt_direct_SOURCES = tests/ckpt/test_ckpt_direct.c tests/ckpt/crash_shim.c \
	tests/ckpt/crash_shim.h
tests_ckpt_test_ckpt_direct_LDADD = $(LDADD) -ldl

# Saves in the background (--ckpt-async): the synchronous saves' bytes, a
# resume, a signal while one is in flight, and a crash at every call of one
# (crash_shim.so preloaded, also as a slow file system).
dist_check_SCRIPTS += tests/ckpt/test_ckpt_async.sh

# Readers refuse files that would take bytes from other files; faults of
# the readers (FIFOs, escapes in names, huge safetensors headers).
dist_check_SCRIPTS += tests/ckpt/test_ckpt_escape.sh tests/ckpt/test_reader_faults.sh
dist_check_DATA += tests/ckpt/make_escape.py

# Per-tensor checksums: damaged and swapped files refused by every reader.
dist_check_SCRIPTS += tests/ckpt/test_checksums.sh

# Shard summaries: rows read through them equal HDF5's, checkpoints without
# them still read, and a damaged, foreign or stale summary is refused.
dist_check_SCRIPTS += tests/ckpt/test_ckpt_summary.sh

# Hugging Face model directories (import-hf, export-hf) against transformers
# 4.38 (hf-venv, see doc/testing.md).
dist_check_SCRIPTS += tests/ckpt/test_hf_dir.sh
dist_check_DATA += tests/ckpt/hf_dir_check.py

# The special-token ids through import-hf, training and export-hf, and
# transformers' generate() on the export.
dist_check_SCRIPTS += tests/ckpt/test_hf_tokens.sh
dist_check_DATA += tests/ckpt/hf_tokens_check.py

# The io layer's save and load throughput at a model's shape, without a
# trainer (tests/peers/run_ckpt_bench.sh runs it; not a test).
check_PROGRAMS += tests/ckpt/bench_ckpt_io
tests_ckpt_bench_ckpt_io_SOURCES = tests/ckpt/bench_ckpt_io.c
