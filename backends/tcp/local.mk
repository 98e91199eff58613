# backends/tcp: Gloo-like collectives over a full mesh of TCP connections
libfsdpc_a_SOURCES += backends/tcp/tcp_ops.c backends/tcp/tcp_algo.c backends/tcp/tcp_engine.c \
	backends/tcp/tcp_xfer.c backends/tcp/tcp_conn.c
noinst_HEADERS += backends/tcp/tcp.h

PROGRAM_TESTS += tests/backends/test_tcp_threads

# multi-process fault tests: plain processes rendezvousing through env://
check_PROGRAMS += tests/backends/tcp_probe
dist_check_SCRIPTS += tests/backends/test_tcp_faults.sh
