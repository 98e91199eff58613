# The CUDA device's kernels in the library (src/compute/cuda/*.cu, built by
# nvcc), which make `--device cuda` available: --enable-cuda-kernels, on by
# default when --with-cuda was asked for explicitly; off when the toolkit
# was only found (the default build stays a CPU build that tests the CUDA
# sources under emulation). NVCC_ARCH sets the GPU targets (default sm_80
# and sm_90).
AC_DEFUN([FSDP_CHECK_CUDA_KERNELS], [
  AC_ARG_ENABLE([cuda-kernels],
    [AS_HELP_STRING([--enable-cuda-kernels],
      [build the CUDA device's kernels with nvcc (default: yes with --with-cuda, else no)])],
    [], [AS_CASE([$with_cuda], [check|no], [enable_cuda_kernels=no], [enable_cuda_kernels=yes])])
  AS_IF([test "x$enable_cuda_kernels" = xyes && test "x$fsdp_have_cuda" != xyes],
    [AC_MSG_ERROR([--enable-cuda-kernels needs the CUDA toolkit (--with-cuda=DIR)])])
  AC_ARG_VAR([NVCC_ARCH], [nvcc -gencode flags for the CUDA kernels (default: sm_80 and sm_90)])
  AS_IF([test -z "$NVCC_ARCH"],
    [NVCC_ARCH="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"])
  AS_IF([test "x$enable_cuda_kernels" = xyes],
    [AC_DEFINE([HAVE_CUDA_KERNELS], [1], [Define to 1 when the CUDA device's kernels are built])
     CUDA_LIBS="$CUDA_LIBS -lstdc++"],
    [AC_DEFINE([HAVE_CUDA_KERNELS], [0], [Define to 1 when the CUDA device's kernels are built])])
  AM_CONDITIONAL([FSDP_CUDA_KERNELS], [test "x$enable_cuda_kernels" = xyes])
  AC_MSG_CHECKING([whether to build the CUDA device's kernels])
  AC_MSG_RESULT([$enable_cuda_kernels])
])
