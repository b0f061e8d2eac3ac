#include "ndmesh/parallel/ep/ep_comm.hpp"

#include <chrono>
#include <numeric>
#include <span>

namespace ndmesh::parallel {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

void CommunicatorEpComm::all_to_all(const std::int64_t* in, std::int64_t* out, std::int64_t n) {
  const auto t0 = Clock::now();
  const auto total = static_cast<std::size_t>(n * size());
  group_.all_to_all(std::span<const std::int64_t>(in, total), std::span<std::int64_t>(out, total));
  stats_->calls += 1;
  stats_->seconds += since(t0);
}

template <typename T>
void CommunicatorEpComm::exchange(const T* in, const std::int64_t* send_counts, T* out,
                                  const std::int64_t* recv_counts) {
  const auto t0 = Clock::now();
  const auto p = static_cast<std::size_t>(size());
  const std::span<const std::int64_t> sc(send_counts, p), rc(recv_counts, p);
  const auto sent = std::accumulate(sc.begin(), sc.end(), std::int64_t{0});
  const auto received = std::accumulate(rc.begin(), rc.end(), std::int64_t{0});
  group_.all_to_all_v(std::span<const T>(in, static_cast<std::size_t>(sent)), sc,
                      std::span<T>(out, static_cast<std::size_t>(received)), rc);
  stats_->calls += 1;
  stats_->elements += sent;
  stats_->seconds += since(t0);
}

void CommunicatorEpComm::all_to_all_v(const float* in, const std::int64_t* send_counts, float* out,
                                      const std::int64_t* recv_counts) {
  exchange(in, send_counts, out, recv_counts);
}

void CommunicatorEpComm::all_to_all_v(const double* in, const std::int64_t* send_counts, double* out,
                                      const std::int64_t* recv_counts) {
  exchange(in, send_counts, out, recv_counts);
}

void CommunicatorEpComm::sum_over_batch(double* v, std::int64_t n) {
  if (batch_.size() > 1) batch_.all_reduce(std::span<double>(v, static_cast<std::size_t>(n)));
}

void CommunicatorEpComm::sum_over_tp(double* v, std::int64_t n) {
  if (tp_.size() > 1) tp_.all_reduce(std::span<double>(v, static_cast<std::size_t>(n)));
}

}  // namespace ndmesh::parallel
