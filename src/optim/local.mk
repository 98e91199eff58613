# src/optim: the optimizer (AdamW over ranges of a unit) and the f16 loss
# scaler, used by the parallelisms and the single-rank oracle.
libfsdpc_a_SOURCES += src/optim/optim.c
noinst_HEADERS += src/optim/optim.h

# the CPU AdamW kernel against its one-element reference (bit for bit), and
# the optimizer's threaded ranges against one thread
PROGRAM_TESTS += tests/optim/test_adamw

# the CPU AdamW benchmark, built on request only (`make tests/bench/bench_adamw`),
# and its driver beside torch.optim.AdamW (doc/performance.md)
EXTRA_PROGRAMS = tests/bench/bench_adamw
CLEANFILES += tests/bench/bench_adamw$(EXEEXT)
EXTRA_DIST += tests/peers/run_adamw_bench.sh tests/peers/torch_adamw_bench.py
