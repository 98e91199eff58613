# Optional CUDA toolkit: --with-cuda[=DIR]. Guessed by default (/usr/local/cuda);
# an error only when asked for explicitly and missing.
AC_DEFUN([FSDP_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
      [build CUDA kernels and the CUDA memory path with the toolkit in DIR (default: guess /usr/local/cuda; --without-cuda disables)])],
    [], [with_cuda=check])
  fsdp_have_cuda=no
  CUDA_CFLAGS=
  CUDA_LIBS=
  NVCC=
  AS_IF([test "x$with_cuda" != xno], [
    AS_CASE([$with_cuda], [yes|check], [fsdp_cuda_dir=/usr/local/cuda], [fsdp_cuda_dir=$with_cuda])
    AS_IF([test -x "$fsdp_cuda_dir/bin/nvcc" && test -f "$fsdp_cuda_dir/include/cuda_runtime.h"], [
      fsdp_have_cuda=yes
      NVCC="$fsdp_cuda_dir/bin/nvcc"
      CUDA_CFLAGS="-I$fsdp_cuda_dir/include"
      CUDA_LIBS="-L$fsdp_cuda_dir/lib64 -Wl,-rpath,$fsdp_cuda_dir/lib64 -lcublasLt -lcublas -lcudart"
    ])
    AS_IF([test "x$fsdp_have_cuda" = xno && test "x$with_cuda" != xcheck],
      [AC_MSG_ERROR([--with-cuda given but no usable CUDA toolkit in $fsdp_cuda_dir (need bin/nvcc and include/cuda_runtime.h)])])
  ])
  AC_MSG_CHECKING([for CUDA toolkit])
  AC_MSG_RESULT([$fsdp_have_cuda])
  AS_IF([test "x$fsdp_have_cuda" = xyes],
    [AC_DEFINE([HAVE_CUDA], [1], [Define to 1 when built with the CUDA toolkit])],
    [AC_DEFINE([HAVE_CUDA], [0], [Define to 1 when built with the CUDA toolkit])])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$fsdp_have_cuda" = xyes])
  AC_SUBST([NVCC])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
])

# Optional NCCL: --with-nccl[=DIR]. Needs CUDA.
AC_DEFUN([FSDP_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@],
      [build the nccl collective backend with NCCL in DIR (default: guess the CUDA dir and /usr; --without-nccl disables)])],
    [], [with_nccl=check])
  fsdp_have_nccl=no
  NCCL_CFLAGS=
  NCCL_LIBS=
  AS_IF([test "x$with_nccl" != xno && test "x$fsdp_have_cuda" = xyes], [
    AS_CASE([$with_nccl],
      [yes|check], [fsdp_nccl_dirs="$fsdp_cuda_dir /usr/local /usr"],
      [fsdp_nccl_dirs=$with_nccl])
    for fsdp_d in $fsdp_nccl_dirs; do
      AS_IF([test -f "$fsdp_d/include/nccl.h"], [
        for fsdp_l in lib64 lib lib/x86_64-linux-gnu; do
          AS_IF([test -e "$fsdp_d/$fsdp_l/libnccl.so"], [
            fsdp_have_nccl=yes
            NCCL_CFLAGS="-I$fsdp_d/include"
            NCCL_LIBS="-L$fsdp_d/$fsdp_l -Wl,-rpath,$fsdp_d/$fsdp_l -lnccl"
            break
          ])
        done
      ])
      AS_IF([test "x$fsdp_have_nccl" = xyes], [break])
    done
  ])
  AS_IF([test "x$fsdp_have_nccl" = xno && test "x$with_nccl" != xcheck && test "x$with_nccl" != xno],
    [AC_MSG_ERROR([--with-nccl given but NCCL (include/nccl.h, libnccl.so) not found, or CUDA missing])])
  AC_MSG_CHECKING([for NCCL])
  AC_MSG_RESULT([$fsdp_have_nccl])
  AS_IF([test "x$fsdp_have_nccl" = xyes],
    [AC_DEFINE([HAVE_NCCL], [1], [Define to 1 when the nccl backend is built])],
    [AC_DEFINE([HAVE_NCCL], [0], [Define to 1 when the nccl backend is built])])
  AM_CONDITIONAL([HAVE_NCCL], [test "x$fsdp_have_nccl" = xyes])
  AC_SUBST([NCCL_CFLAGS])
  AC_SUBST([NCCL_LIBS])
])
