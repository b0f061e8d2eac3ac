// The table behind cuda::kernel_times_start / kernel_times_stop (tensor/kernel_times.hpp):
// intervals booked to the operation that ends them, the idle estimate after a host wait
// moved to its own row and never more than the interval, rows by time.
#include <gtest/gtest.h>

#include "ndmesh/tensor/kernel_times.hpp"

namespace ndmesh::cuda::detail {
namespace {

TEST(KernelTimeTable, BooksIntervalsByNameWithTheIdleAfterAWaitApart) {
  KernelTimeTable t;
  t.add("gemm", 2.0);
  t.add("layernorm", 0.5);
  t.add("gemm", 1.0, 0.25);      // the first launch after a host wait: 0.25 s of it idle
  t.add("layernorm", 0.1, 5.0);  // an idle estimate longer than the interval: all of it idle
  t.add("memset", -1.0);         // a clock that ran backwards books nothing
  t.host_wait(0.3);
  t.host_wait(0.2);
  const KernelTimes r = t.result();
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[0].name, "gemm");
  EXPECT_EQ(r.rows[0].calls, 2);
  EXPECT_DOUBLE_EQ(r.rows[0].seconds, 2.75);
  EXPECT_EQ(r.rows[1].name, "layernorm");
  EXPECT_EQ(r.rows[1].calls, 2);
  EXPECT_DOUBLE_EQ(r.rows[1].seconds, 0.5);
  EXPECT_EQ(r.rows[2].name, KernelTimeTable::kIdleAfterWait);
  EXPECT_EQ(r.rows[2].calls, 2);
  EXPECT_DOUBLE_EQ(r.rows[2].seconds, 0.35);
  EXPECT_EQ(r.rows[3].name, "memset");
  EXPECT_DOUBLE_EQ(r.rows[3].seconds, 0.0);
  EXPECT_DOUBLE_EQ(r.seconds, 3.6) << "every interval once: the rows' sum";
  EXPECT_EQ(r.host_waits, 2);
  EXPECT_DOUBLE_EQ(r.host_wait_seconds, 0.5);
}

TEST(KernelTimeTable, EmptyTableHasNoRows) {
  const KernelTimes r = KernelTimeTable{}.result();
  EXPECT_TRUE(r.rows.empty());
  EXPECT_EQ(r.seconds, 0.0);
  EXPECT_EQ(r.host_waits, 0);
}

}  // namespace
}  // namespace ndmesh::cuda::detail
