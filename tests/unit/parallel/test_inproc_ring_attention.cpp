// The mpirun tests of ring attention (tests/mpi/test_ring_attention.cpp: each rank's output,
// log-sum-exp and q/k/v gradients against the local attention kernel over the whole
// sequence, forward and backward, zigzag and contiguous) on in-process cp groups of 1, 2
// and 4 ranks.
#define NDMESH_TEST_INPROC 1
#define NDMESH_INPROC_WORLD_SIZES 1, 2, 4
#include "mpi/test_ring_attention.cpp"
