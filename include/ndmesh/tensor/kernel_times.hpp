// The bookkeeping behind cuda::kernel_times_start / kernel_times_stop (tensor/device.hpp),
// shared by the CUDA device (src/tensor/cuda/device.cu: GPU time between events) and the
// CUDA emulator (tests/gpu/emulator/device.cpp: host time between marks). No fmt and no
// ndmesh/core header: nvcc compiles it.
//
// Every operation on the compute stream ends with a mark; the interval from the previous
// mark to this one belongs to this mark's operation. On one stream that interval is the
// operation's own run time whenever the GPU had work queued; when it had none (the host was
// slower than the GPU, or had just waited for it), the interval also holds the time the
// GPU sat idle. After a host wait the host's own time until its next launch is known (its
// clock), and that much of the next interval is booked as idle instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ndmesh/tensor/device.hpp"

namespace ndmesh::cuda::detail {

class KernelTimeTable {
 public:
  /// The row an estimate of idle GPU time after the host waited goes to.
  static constexpr const char* kIdleAfterWait = "(GPU idle: host work after a host wait)";

  /// One interval of `seconds` ended by operation `name`; `idle` of it (at most all of it) is
  /// booked as idle after a host wait.
  void add(const std::string& name, double seconds, double idle = 0) {
    seconds = std::max(seconds, 0.0);
    idle = std::clamp(idle, 0.0, seconds);
    KernelTime& r = rows_[name];
    r.name = name;
    ++r.calls;
    r.seconds += seconds - idle;
    if (idle > 0) {
      KernelTime& i = rows_[kIdleAfterWait];
      i.name = kIdleAfterWait;
      ++i.calls;
      i.seconds += idle;
    }
    total_ += seconds;
  }
  /// The host waited `seconds` for the compute stream.
  void host_wait(double seconds) {
    ++waits_;
    wait_seconds_ += std::max(seconds, 0.0);
  }
  KernelTimes result() const {
    KernelTimes t;
    for (const auto& [name, row] : rows_) t.rows.push_back(row);
    std::stable_sort(t.rows.begin(), t.rows.end(),
                     [](const KernelTime& a, const KernelTime& b) { return a.seconds > b.seconds; });
    t.seconds = total_;
    t.host_waits = waits_;
    t.host_wait_seconds = wait_seconds_;
    return t;
  }

 private:
  std::map<std::string, KernelTime> rows_;
  double total_ = 0, wait_seconds_ = 0;
  std::int64_t waits_ = 0;
};

}  // namespace ndmesh::cuda::detail
