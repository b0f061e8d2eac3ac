// GoogleTest main for tests that run as every rank of an mpirun job. Every rank runs
// every test; rank 0 prints the usual report, the others print only their failures
// (prefixed with their rank), and the job fails when any rank fails.
#include <cstdio>

#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"

namespace {

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  auto world = ndmesh::comm::Communicator::world();
  if (world.rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world.rank()));
  }
  int result = RUN_ALL_TESTS();
  // Every rank leaves together, so a failure on one rank is not mistaken for a hang.
  world.barrier();
  return result;
}
