// The mpirun tests of the all-reduce algorithms (tests/mpi/test_allreduce.cpp) on
// in-process jobs of the sizes the mpirun runs use, 1 to 16 ranks.
#define NDMESH_TEST_INPROC 1
#define NDMESH_INPROC_WORLD_SIZES 1, 2, 3, 5, 8, 16
#include "mpi/test_allreduce.cpp"
