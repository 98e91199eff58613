# src/compute: the compute layer: host kernels (f32 compute, OpenBLAS sgemm).
libfsdpc_a_SOURCES += \
	src/compute/cpu/layers.c \
	src/compute/cpu/matmul.c \
	src/compute/cpu/attention.c \
	src/compute/cpu/llama_layers.c \
	src/compute/cpu/decode.c \
	src/compute/cpu/loss.c \
	src/compute/cpu/optim.c \
	src/compute/cpu/adamw.c \
	src/compute/cpu/cast.c \
	src/compute/cpu/small.c \
	src/compute/device.c \
	src/compute/device_guarded.c \
	src/compute/device_cpu.c \
	src/compute/device_cpu_ops.c
noinst_HEADERS += src/compute/kernels.h src/compute/device.h src/compute/device_impl.h src/compute/cpu/simd.h

PROGRAM_TESTS += tests/kernels/test_kernels_grad tests/kernels/test_llama_kernels \
	tests/kernels/test_device
noinst_HEADERS += tests/kernels/ref_kernels.h

# CUDA kernels (src/compute/cuda): compiled by nvcc for the GPU, and here as
# host C++ under the execution-model emulation, against the CPU kernels.
noinst_HEADERS += src/compute/cuda/emu.h src/compute/cuda/common.cuh \
	src/compute/cuda/kernels_cuda.h
FSDP_CUDA_SOURCES = src/compute/cuda/norms.cu src/compute/cuda/elementwise.cu \
	src/compute/cuda/optim.cu src/compute/cuda/loss.cu src/compute/cuda/small.cu \
	src/compute/cuda/embed.cu src/compute/cuda/attention.cu src/compute/cuda/table.cu
EXTRA_DIST += $(FSDP_CUDA_SOURCES)
PROGRAM_TESTS += tests/kernels/test_cuda_emu tests/kernels/test_cuda_table
tests_kernels_test_cuda_emu_SOURCES = tests/kernels/test_cuda_emu.cpp \
	tests/kernels/cuda_emu_kernels.cpp
tests_kernels_test_cuda_table_SOURCES = tests/kernels/test_cuda_table.cpp \
	tests/kernels/cuda_emu_kernels.cpp
noinst_HEADERS += src/compute/cuda/attention_cuda.h
PROGRAM_TESTS += tests/kernels/test_cuda_attention
tests_kernels_test_cuda_attention_SOURCES = tests/kernels/test_cuda_attention.cpp \
	tests/kernels/cuda_emu_kernels.cpp
# fsdpc-train with the CUDA table under emulation as device cuda-emu
check_PROGRAMS += tests/kernels/train_cuda_emu
tests_kernels_train_cuda_emu_SOURCES = tests/kernels/train_cuda_emu.cpp \
	tests/kernels/cuda_emu_kernels.cpp src/programs/train_program.c src/programs/sample_program.c
dist_check_SCRIPTS += tests/kernels/test_cuda_train.sh
dist_check_SCRIPTS += tests/kernels/test_cuda_nvcc.sh

# The cuda device's host side (plain C over the CUDA runtime): in the
# library of CUDA builds only; its test compiles it in every build against
# a simulated runtime (tests/kernels/cuda_sim.c and its own copy of the
# runtime API header), never against libcudart, so it runs without a GPU.
if HAVE_CUDA
libfsdpc_a_SOURCES += src/compute/cuda/device_cuda.c
endif

# The kernels in the library (--enable-cuda-kernels, or --with-cuda): nvcc
# builds each source for NVCC_ARCH, and the cuda device uses their table.
if FSDP_CUDA_KERNELS
libfsdpc_a_SOURCES += $(FSDP_CUDA_SOURCES)
endif
SUFFIXES += .cu
.cu.$(OBJEXT):
	$(AM_V_CC)$(NVCC) -std=c++17 -O3 $(NVCC_ARCH) -I$(top_srcdir)/src -I$(top_srcdir) \
	    -I$(top_builddir) -Xcompiler -Wall,-Wextra -c $< -o $@
noinst_HEADERS += src/compute/cuda/device_cuda.h
PROGRAM_TESTS += tests/kernels/test_cuda_device
tests_kernels_test_cuda_device_SOURCES = tests/kernels/test_cuda_device.c \
	tests/kernels/cuda_sim.c tests/kernels/cuda_sim.h src/compute/cuda/device_cuda.c
tests_kernels_test_cuda_device_CPPFLAGS = -DFSDP_CUDA_SIM -I$(top_srcdir)/tests/kernels/cuda_sim_api \
	$(AM_CPPFLAGS)
# everything the library needs but CUDA, which the simulation replaces
tests_kernels_test_cuda_device_LDADD = libfsdpc.a $(HDF5_LIBS) $(MPI_LIBS) $(BLAS_LIBS) \
	$(CRYPTO_LIBS) $(XXHASH_LIBS) $(PCRE2_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS) $(LIBS) -lm
EXTRA_DIST += tests/kernels/cuda_sim_api/cuda_runtime_api.h

# The cuda device's matmuls through cuBLASLt (plain C): in the library of
# CUDA builds only; its test compiles it in every build against the
# simulated runtime and a simulated cuBLASLt (tests/kernels/cublaslt_sim.c
# and its own copy of cublasLt.h), never against libcublasLt.
if HAVE_CUDA
libfsdpc_a_SOURCES += src/compute/cuda/matmul_cuda.c
endif
noinst_HEADERS += src/compute/cuda/matmul_cuda.h
PROGRAM_TESTS += tests/kernels/test_cuda_matmul
tests_kernels_test_cuda_matmul_SOURCES = tests/kernels/test_cuda_matmul.c \
	tests/kernels/cublaslt_sim.c tests/kernels/cublaslt_sim.h \
	tests/kernels/cuda_sim.c tests/kernels/cuda_sim.h \
	src/compute/cuda/matmul_cuda.c src/compute/cuda/device_cuda.c
tests_kernels_test_cuda_matmul_CPPFLAGS = -DFSDP_CUDA_SIM -I$(top_srcdir)/tests/kernels/cublaslt_sim_api \
	-I$(top_srcdir)/tests/kernels/cuda_sim_api $(AM_CPPFLAGS)
tests_kernels_test_cuda_matmul_LDADD = $(tests_kernels_test_cuda_device_LDADD)
EXTRA_DIST += tests/kernels/cublaslt_sim_api/cublasLt.h
