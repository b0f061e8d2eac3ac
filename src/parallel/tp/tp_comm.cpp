#include "ndmesh/parallel/tp/tp_comm.hpp"

#include <chrono>
#include <span>

namespace ndmesh::parallel {

namespace {
// Adds the wall time of its scope to `seconds`.
struct Timed {
  double& seconds;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~Timed() { seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};
}  // namespace

template <typename T>
void CommunicatorTpComm<T>::reduce(T* data, std::int64_t n, comm::ReduceOp op) {
  if (group_.size() == 1) return;
  stats_->all_reduce.calls += 1;
  stats_->all_reduce.bytes += n * static_cast<std::int64_t>(sizeof(T));
  Timed timed{stats_->seconds};
  group_.all_reduce(std::span<T>(data, static_cast<std::size_t>(n)), {.op = op});
}

template <typename T>
template <typename E>
void CommunicatorTpComm<T>::gather(const E* in, E* out, std::int64_t n) {
  if (group_.size() == 1) {
    std::copy(in, in + n, out);
    return;
  }
  stats_->all_gather.calls += 1;
  stats_->all_gather.bytes += n * group_.size() * static_cast<std::int64_t>(sizeof(E));
  Timed timed{stats_->seconds};
  group_.all_gather(std::span<const E>(in, static_cast<std::size_t>(n)),
                    std::span<E>(out, static_cast<std::size_t>(n * group_.size())));
}

template <typename T>
void CommunicatorTpComm<T>::all_gather(const T* in, T* out, std::int64_t n) {
  gather(in, out, n);
}

template <typename T>
void CommunicatorTpComm<T>::all_gather(const BFloat16* in, BFloat16* out, std::int64_t n) {
  gather(in, out, n);
}

template <typename T>
void CommunicatorTpComm<T>::reduce_scatter(const T* in, T* out, std::int64_t n) {
  if (group_.size() == 1) {
    std::copy(in, in + n, out);
    return;
  }
  stats_->reduce_scatter.calls += 1;
  stats_->reduce_scatter.bytes += n * group_.size() * static_cast<std::int64_t>(sizeof(T));
  Timed timed{stats_->seconds};
  group_.reduce_scatter(std::span<const T>(in, static_cast<std::size_t>(n * group_.size())),
                        std::span<T>(out, static_cast<std::size_t>(n)));
}

template class CommunicatorTpComm<float>;
template class CommunicatorTpComm<double>;

}  // namespace ndmesh::parallel
