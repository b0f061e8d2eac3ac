// The worlds a multi-rank test body runs in, so that one test source serves both layers:
//  - under mpirun (tests/mpi), for_each_world(body) runs body once on this process's rank
//    of the job's world (Communicator::world());
//  - compiled with NDMESH_TEST_INPROC (tests/unit/comm/test_inproc_*.cpp include the mpirun
//    sources), it runs body on every rank of in-process jobs (comm/inproc.hpp) of each
//    size in kInprocWorldSizes, one after another, and a failing rank fails the test.
// gtest assertions work on every rank's thread; ASSERT_* returns from the body of that
// rank only, and the in-process job then fails the others' waits for it at once.
#pragma once

#include <functional>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/inproc.hpp"

namespace ndmesh::testing_support {

/// Sizes of the in-process worlds of NDMESH_TEST_INPROC builds (odd ones, and 1); a
/// source may define NDMESH_INPROC_WORLD_SIZES before including this header (the sizes
/// its mpirun runs use).
#ifndef NDMESH_INPROC_WORLD_SIZES
#define NDMESH_INPROC_WORLD_SIZES 1, 2, 3, 4
#endif
inline constexpr int kInprocWorldSizes[] = {NDMESH_INPROC_WORLD_SIZES};

#ifdef NDMESH_TEST_INPROC
inline constexpr bool kInproc = true;
inline void for_each_world(const std::function<void(const comm::Communicator& world)>& body) {
  for (int n : kInprocWorldSizes) comm::inproc::run(n, body);
}
#else
inline constexpr bool kInproc = false;
inline void for_each_world(const std::function<void(const comm::Communicator& world)>& body) {
  body(comm::Communicator::world());
}
#endif

}  // namespace ndmesh::testing_support
