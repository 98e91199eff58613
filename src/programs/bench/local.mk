# src/programs/bench: fsdpc-bench, the collective benchmark, its smoke test,
# and the peer benchmarks it is compared with (built by tests/peers/Makefile,
# never by the product's build).
bin_PROGRAMS += fsdpc-bench
fsdpc_bench_SOURCES = src/programs/bench/bench_main.c src/programs/bench/bench_data.c src/programs/bench/bench_mem.c \
	src/programs/bench/bench_allreduce.c src/programs/bench/bench_allgather.c \
	src/programs/bench/bench_reduce_scatter.c src/programs/bench/bench_broadcast.c
noinst_HEADERS += src/programs/bench/bench.h

PROGRAM_TESTS += tests/bench/test_bench_data
tests_bench_test_bench_data_SOURCES = tests/bench/test_bench_data.c src/programs/bench/bench_data.c
dist_check_SCRIPTS += tests/bench/test_bench.sh

EXTRA_DIST += tests/peers/Makefile tests/peers/run_comm_bench.sh tests/peers/gloo_bench.cc \
	tests/peers/mpi_raw_bench.c tests/peers/tcp_loopback.c tests/peers/memcpy_bench.c \
	tests/peers/peer_common.h
