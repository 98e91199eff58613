# backends/nccl fragment: the NCCL collective backend and its tests, built
# only when configure found CUDA and NCCL.
#   test_nccl             the real thing; every check skips without a CUDA device
#   test_nccl_sim         the backend's control logic against a simulated CUDA
#                         runtime and NCCL (no GPU, no libcudart/libnccl needed)
#   test_nccl_sim_api226  the same, compiled against the NCCL 2.26 API
#                         (tests/backends/nccl_sim_api/nccl.h: no commName)
#   libnccl_api214.a      the backend compiled against the 2.14 API, the
#                         oldest it supports (compiled by make check, not run)
#   train_nccl_sim        fsdpc-train over the nccl backend on a simulated CUDA
#                         device, NCCL's collectives moved between the rank
#                         processes by MPI (tests/backends/mpsim*.c), run by
#                         test_nccl_train_sim.sh against --device cpu --backend mpi
#                         (dp, tp, rdp) and test_nccl_train_paths.sh (pipeline,
#                         offload, checkpoints, join, staging in chunks)
if HAVE_NCCL
libfsdpc_a_SOURCES += backends/nccl/nccl_comm.c backends/nccl/nccl_ops.c
noinst_HEADERS += backends/nccl/nccl_be.h

NCCL_SIM_SOURCES = tests/backends/test_nccl_sim.c tests/backends/nccl_sim.c \
	tests/backends/nccl_sim.h backends/nccl/nccl_comm.c backends/nccl/nccl_ops.c \
	src/programs/bench/bench_mem.c
NCCL_SIM_API_CPPFLAGS = -I$(top_srcdir)/tests/backends/nccl_sim_api $(AM_CPPFLAGS)
# everything the library needs but CUDA and NCCL, which the simulation replaces
NCCL_SIM_LIBS = libfsdpc.a $(HDF5_LIBS) $(MPI_LIBS) $(BLAS_LIBS) $(CRYPTO_LIBS) $(XXHASH_LIBS) \
	$(PTHREAD_LIBS) $(LIBS) -lm

PROGRAM_TESTS += tests/backends/test_nccl tests/backends/test_nccl_sim \
	tests/backends/test_nccl_sim_api226
tests_backends_test_nccl_sim_SOURCES = $(NCCL_SIM_SOURCES)
tests_backends_test_nccl_sim_LDADD = $(NCCL_SIM_LIBS)
tests_backends_test_nccl_sim_api226_SOURCES = $(NCCL_SIM_SOURCES)
tests_backends_test_nccl_sim_api226_CPPFLAGS = -DSIM_NCCL_API=22602 $(NCCL_SIM_API_CPPFLAGS)
tests_backends_test_nccl_sim_api226_LDADD = $(NCCL_SIM_LIBS)

check_LIBRARIES = tests/backends/libnccl_api214.a
tests_backends_libnccl_api214_a_SOURCES = backends/nccl/nccl_comm.c backends/nccl/nccl_ops.c
tests_backends_libnccl_api214_a_CPPFLAGS = -DSIM_NCCL_API=21403 $(NCCL_SIM_API_CPPFLAGS)

# device_cuda.c compiled here without the kernel table (FSDP_CUDA_SIM), so
# the library's copy, whose table needs libcudart in a build with the
# kernels, is not linked
check_PROGRAMS += tests/backends/train_nccl_sim
tests_backends_train_nccl_sim_SOURCES = tests/backends/train_nccl_sim.c \
	tests/backends/mpsim.h tests/backends/mpsim_cuda.c tests/backends/mpsim_nccl.c \
	backends/nccl/nccl_comm.c backends/nccl/nccl_ops.c src/compute/cuda/device_cuda.c \
	src/programs/train_program.c
tests_backends_train_nccl_sim_CPPFLAGS = -DFSDP_CUDA_SIM $(AM_CPPFLAGS)
tests_backends_train_nccl_sim_LDADD = libfsdpc.a $(HDF5_LIBS) $(MPI_LIBS) $(BLAS_LIBS) \
	$(CRYPTO_LIBS) $(XXHASH_LIBS) $(PCRE2_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS) $(LIBS) -lm
dist_check_SCRIPTS += tests/backends/test_nccl_train_sim.sh \
	tests/backends/test_nccl_train_paths.sh
endif

# the checks a person runs on a GPU machine (see doc/backend-nccl.md), and
# the check that they skip cleanly on a machine without one
EXTRA_DIST += tests/gpu/run_gpu_checks.sh tests/gpu/kit.sh tests/peers/torch_gpt2_bench.py tests/backends/nccl_sim_api/nccl.h
dist_check_SCRIPTS += tests/gpu/test_gpu_skip.sh
