# backends/mpi fragment
