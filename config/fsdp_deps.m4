# Required dependencies: MPICH, HDF5 (MPICH flavour), BLAS (OpenBLAS).
# MPICH is named explicitly: the generic mpicc/mpiexec alternatives may point
# to Open MPI on Debian once other packages are installed.

AC_DEFUN([FSDP_CHECK_MPICH], [
  AC_ARG_VAR([MPIEXEC], [MPI launcher used by the tests (default: mpiexec.mpich)])
  PKG_CHECK_MODULES([MPI], [mpich], [],
    [AC_MSG_ERROR([MPICH not found (pkg-config mpich); on Debian: apt-get install libmpich-dev mpich])])
  AC_PATH_PROGS([MPIEXEC], [mpiexec.mpich mpiexec.hydra], [no])
  AS_IF([test "x$MPIEXEC" = xno],
    [AC_MSG_ERROR([mpiexec.mpich not found; on Debian: apt-get install mpich])])
  MPICH_VERSION_STR=`$PKG_CONFIG --modversion mpich`
  fsdp_save_CPPFLAGS=$CPPFLAGS
  CPPFLAGS="$CPPFLAGS $MPI_CFLAGS"
  AC_CHECK_HEADER([mpi.h], [], [AC_MSG_ERROR([mpi.h not usable with $MPI_CFLAGS])])
  CPPFLAGS=$fsdp_save_CPPFLAGS
  AC_SUBST([MPICH_VERSION_STR])
])

AC_DEFUN([FSDP_CHECK_HDF5], [
  PKG_CHECK_MODULES([HDF5], [hdf5-mpich], [],
    [AC_MSG_ERROR([HDF5 (MPICH flavour) not found (pkg-config hdf5-mpich); on Debian: apt-get install libhdf5-mpich-dev])])
  fsdp_save_CPPFLAGS=$CPPFLAGS
  CPPFLAGS="$CPPFLAGS $HDF5_CFLAGS"
  AC_CHECK_HEADER([hdf5.h], [], [AC_MSG_ERROR([hdf5.h not usable with $HDF5_CFLAGS])])
  CPPFLAGS=$fsdp_save_CPPFLAGS
])

AC_DEFUN([FSDP_CHECK_BLAS], [
  PKG_CHECK_MODULES([BLAS], [openblas], [],
    [AC_MSG_ERROR([OpenBLAS not found (pkg-config openblas); on Debian: apt-get install libopenblas-dev])])
])

# A small pthread check: this project targets Linux with glibc.
AC_DEFUN([AX_PTHREAD_SIMPLE], [
  AC_CHECK_HEADER([pthread.h], [], [AC_MSG_ERROR([pthread.h not found])])
  PTHREAD_LIBS="-pthread"
  AC_SUBST([PTHREAD_LIBS])
])
