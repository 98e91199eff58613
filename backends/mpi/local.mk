# backends/mpi fragment: the MPI collective backend and the collective
# correctness matrix (which also runs the tcp backend).
libfsdpc_a_SOURCES += backends/mpi/mpi_ops.c backends/mpi/mpi_types.c
noinst_HEADERS += backends/mpi/mpi_priv.h

check_PROGRAMS += tests/backends/test_coll
dist_check_SCRIPTS += tests/backends/test_coll.sh
