// The mpirun tests of every Communicator operation (tests/mpi/test_comm_collectives.cpp)
// on in-process jobs of 1 to 4 ranks: the in-process backend passes the tests MPI passes.
#define NDMESH_TEST_INPROC 1
#include "mpi/test_comm_collectives.cpp"
