# src/compute: the compute layer: host kernels (f32 compute, OpenBLAS sgemm).
libfsdpc_a_SOURCES += \
	src/compute/cpu/layers.c \
	src/compute/cpu/matmul.c \
	src/compute/cpu/attention.c \
	src/compute/cpu/llama_layers.c \
	src/compute/cpu/decode.c \
	src/compute/cpu/loss.c \
	src/compute/cpu/optim.c \
	src/compute/cpu/cast.c \
	src/compute/cpu/small.c \
	src/compute/device.c \
	src/compute/device_guarded.c \
	src/compute/device_cpu.c
noinst_HEADERS += src/compute/kernels.h src/compute/device.h src/compute/device_impl.h src/compute/cpu/simd.h

check_PROGRAMS += tests/kernels/test_kernels_grad tests/kernels/test_llama_kernels \
	tests/kernels/test_device
TESTS += tests/kernels/test_kernels_grad tests/kernels/test_llama_kernels tests/kernels/test_device
noinst_HEADERS += tests/kernels/ref_kernels.h
