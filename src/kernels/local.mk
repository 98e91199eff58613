# src/kernels fragment: host kernels (f32 compute, OpenBLAS sgemm).
libfsdpc_a_SOURCES += \
	src/kernels/cpu/layers.c \
	src/kernels/cpu/matmul.c \
	src/kernels/cpu/attention.c \
	src/kernels/cpu/loss.c \
	src/kernels/cpu/optim.c \
	src/kernels/cpu/cast.c
noinst_HEADERS += src/kernels/kernels.h src/kernels/cpu/simd.h

check_PROGRAMS += tests/kernels/test_kernels_grad
TESTS += tests/kernels/test_kernels_grad
noinst_HEADERS += tests/kernels/ref_kernels.h
