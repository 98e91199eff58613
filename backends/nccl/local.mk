# backends/nccl fragment: the NCCL collective backend and its tests, built
# only when configure found CUDA and NCCL.
#   test_nccl      the real thing; every check skips without a CUDA device
#   test_nccl_sim  the backend's control logic against a simulated CUDA
#                  runtime and NCCL (no GPU, no libcudart/libnccl needed)
if HAVE_NCCL
libfsdpc_a_SOURCES += backends/nccl/nccl_comm.c backends/nccl/nccl_ops.c
noinst_HEADERS += backends/nccl/nccl_be.h

check_PROGRAMS += tests/backends/test_nccl tests/backends/test_nccl_sim
TESTS += tests/backends/test_nccl tests/backends/test_nccl_sim
tests_backends_test_nccl_sim_SOURCES = tests/backends/test_nccl_sim.c tests/backends/nccl_sim.c \
	tests/backends/nccl_sim.h backends/nccl/nccl_comm.c backends/nccl/nccl_ops.c
tests_backends_test_nccl_sim_LDADD = libfsdpc.a $(PTHREAD_LIBS) $(LIBS) -lm
endif

# the checks a person runs on a GPU machine (see doc/backend-nccl.md)
EXTRA_DIST += tests/gpu/run_gpu_checks.sh
