#include "ndmesh/parallel/dp/grad_reducer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/config/training.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::parallel {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::vector<std::string> data_parallel_option_problems(const DataParallelOptions& o) {
  std::vector<std::string> out = zero_problems(o.zero);
  if (!(o.bucket_mb > 0 && o.bucket_mb <= 1 << 20))
    out.push_back(fmt::format("--bucket-mb={} must be in (0, 1048576]; e.g. --bucket-mb 25", o.bucket_mb));
  if (o.ranks_per_node < 0)
    out.push_back(fmt::format("--ranks-per-node={} must be >= 0 (0: the real nodes)", o.ranks_per_node));
  return out;
}

GradReducer::GradReducer(comm::Communicator group, std::int64_t flat_size, DataParallelOptions options,
                         const std::vector<nn::Segment>& units, Device device)
    : group_(std::move(group)),
      options_(options),
      zero_(group_.size() > 1 ? options.zero : 0),
      device_(device),
      flat_size_(flat_size) {
  if (auto problems = data_parallel_option_problems(options); !problems.empty())
    fail<ConfigError>("dp", "{}", fmt::join(problems, "; "));
  const std::int64_t p = group_.size();
  NDMESH_CHECK(zero_ == 0 || flat_size % p == 0, "dp",
               "the flat buffer of {} elements is not a multiple of the dp group size {}", flat_size, p);
  if (p > 1 && zero_ == 0)
    reducer_ = comm::AllReducer(group_,
                                {.algorithm = options_.algorithm, .ranks_per_node = options_.ranks_per_node});
  timeout_s_ = comm::default_timeout_s();
  if (p > 1 && progress_thread()) {
    if (std::string why = group_.thread_limit(); !why.empty()) {
      options_.progress_thread = false;
      static std::once_flag said;  // one line per run: on the process of world rank 0
      if (group_.members()[static_cast<std::size_t>(group_.rank())] == 0)
        std::call_once(said, [&] {
          log::warn(
              "[dp] {}: the data-parallel progress thread is off (it needs MPI_THREAD_MULTIPLE); the "
              "reductions progress only in the model's hooks",
              why);
        });
    }
  }
  // Buckets from the end; with ZeRO every bucket's length is a multiple of p, so each
  // member owns one equal block of it.
  const auto target = std::max<std::int64_t>(
      p, static_cast<std::int64_t>(options_.bucket_mb * 1024 * 1024 / sizeof(float)) / p * p);
  // ZeRO-3 always, ZeRO-2 where the model's units are given (on the CPU): one bucket per unit.
  per_unit_ = zero_ == 3 || (zero_ == 2 && !units.empty());
  if (per_unit_) {  // one bucket per unit, from the end
    NDMESH_CHECK(!units.empty() && units.front().offset == 0 &&
                     units.back().offset + units.back().count == flat_size,
                 "dp", "ZeRO-{} needs the model's unit ranges covering its flat buffer of {} elements", zero_,
                 flat_size);
    for (auto it = units.rbegin(); it != units.rend(); ++it) {
      NDMESH_CHECK(it->count % p == 0, "dp", "ZeRO-{} unit range [{}, {}) is not a multiple of the group size {}",
                   zero_, it->offset, it->offset + it->count, p);
      buckets_.push_back(Bucket{.lo = it->offset, .hi = it->offset + it->count});
    }
  }
  for (std::int64_t hi = per_unit_ ? 0 : flat_size; hi > 0;) {
    std::int64_t lo = std::max<std::int64_t>(0, hi - target);
    buckets_.push_back(Bucket{.lo = lo, .hi = hi});
    hi = lo;
  }
  if (zero_ == 0) {
    shard_.push_back({0, flat_size});
    const std::int64_t r = group_.rank();
    counted_.push_back({r * flat_size / p, (r + 1) * flat_size / p - r * flat_size / p});
  } else {
    const std::int64_t r = group_.rank();
    std::int64_t at = 0;
    for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) {
      const std::int64_t block = (it->hi - it->lo) / p;
      shard_.push_back({it->lo + r * block, block});
      it->shard_at = at;
      at += block;
    }
    if (zero_ >= 2) shard_grads_ = Tensor<float>({flat_size / p}, device_);
    counted_ = shard_;
  }
}

GradReducer::~GradReducer() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void GradReducer::progress_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto last_change = std::chrono::steady_clock::now();
  std::uint64_t seen = handed_;
  const auto give_up = std::chrono::duration<double>(timeout_s_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || (!active_.empty() && !thread_gave_up_); });
    if (stop_) return;
    // New buckets start the clock: an idle gap before them is no sign of a hang.
    if (handed_ != seen) {
      seen = handed_;
      last_change = std::chrono::steady_clock::now();
    }
    // Poll outside the lock: the main thread may append buckets meanwhile.
    std::vector<Bucket*> mine = active_;
    lock.unlock();
    std::vector<Bucket*> finished;
    try {
      for (Bucket* b : mine)
        if (poll(*b)) finished.push_back(b);
    } catch (...) {  // an engine error, or an in-process job that ended: the main thread reports it
      lock.lock();
      thread_error_ = std::current_exception();
      thread_gave_up_ = true;
      done_cv_.notify_all();
      continue;
    }
    lock.lock();
    const auto now = std::chrono::steady_clock::now();
    if (!finished.empty()) {
      thread_completions_ += static_cast<std::int64_t>(finished.size());
      last_change = now;
      std::erase_if(active_, [&](Bucket* b) {
        return std::find(finished.begin(), finished.end(), b) != finished.end();
      });
      done_cv_.notify_all();  // finish_backward waits for none left, wait_in_flight for some
      continue;
    }
    if (now - last_change > give_up) {
      thread_gave_up_ = true;  // finish_backward() reports the timeout
      thread_timed_out_ = true;
      done_cv_.notify_all();
      continue;
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
  }
}

void GradReducer::zero_shard_grads() { shard_grads_.zero(); }

void GradReducer::own_workspace(float* grads, bool mappable) {
  NDMESH_CHECK(per_unit_ && !pages_, "dp",
               "the gradient work space is handed over once, and only to a reducer that goes per unit");
  grads_ = grads;  // the buffer every begin_backward() passes again
  if (mappable && device_ == Device::kCuda) {
    pages_ = std::make_unique<DevicePages>(grads, static_cast<std::size_t>(flat_size_) * sizeof(float));
    pages_->drop_unheld();
    pages_->flush();  // gone now, before the optimizer allocates its state
    return;
  }
  release_memory(grads, flat_size_, 0.0f, device_);
}

void GradReducer::release_workspace() {
  NDMESH_CHECK(grads_ != nullptr, "dp", "release_workspace() before own_workspace()");
  if (!pages_) return release_memory(grads_, flat_size_, 0.0f, device_);
  for (Bucket& b : buckets_) give_back(b);  // none held after a completed backward
  pages_->poll();
}

void GradReducer::begin_unit_backward(const std::vector<int>& ranges) {
  if (!pages_) return;
  pages_->poll();  // what retired units gave back goes first
  for (int id : ranges) {
    NDMESH_CHECK(id >= 0 && static_cast<std::size_t>(id) < buckets_.size(), "dp", "unit range {} of {}", id,
                 buckets_.size());
    back(buckets_[buckets_.size() - 1 - static_cast<std::size_t>(id)]);  // buckets run from the end
  }
}

void GradReducer::writes_at(std::int64_t at) {
  if (!pages_) return;
  pages_->poll();
  for (Bucket& b : buckets_)
    if (b.lo <= at && at < b.hi) return back(b);
  fail<Error>("dp", "gradient offset {} lies outside the flat buffer of {} elements", at, flat_size_);
}

void GradReducer::back(Bucket& b) {
  if (b.held) return;
  pages_->hold(grads_ + b.lo, static_cast<std::size_t>(b.hi - b.lo) * sizeof(float));
  ops::zero(grads_ + b.lo, b.hi - b.lo, device_);  // backed again: undefined contents
  b.held = true;
}

void GradReducer::give_back(Bucket& b) {
  if (!pages_) return release_memory(grads_ + b.lo, b.hi - b.lo, 0.0f, device_);
  if (!b.held) return;
  pages_->drop(grads_ + b.lo, static_cast<std::size_t>(b.hi - b.lo) * sizeof(float));
  b.held = false;
}

void GradReducer::begin_backward(float* grads, bool last) {
  grads_ = grads;
  next_ = 0;
  for (Bucket& b : buckets_) b.started = b.retired = false;
  // One rank alone has nothing to reduce; ZeRO-2 reduces every micro-batch.
  reduce_now_ = group_.size() > 1 && (last || zero_ >= 2);
}

void GradReducer::start(Bucket& b) {
  b.started = true;
  b.start_time = now_s();
  std::span<float> range(grads_ + b.lo, static_cast<std::size_t>(b.hi - b.lo));
  if (options_.bf16) {
    // Rounded where the gradients are (a kernel on the compute stream on CUDA, ordered
    // before the collective that reads the copy); the bucket keeps its copy between steps.
    const auto n = static_cast<std::int64_t>(range.size());
    if (b.low.numel() != n) b.low = Tensor<BFloat16>({n}, device_);
    ops::cast(b.low.data(), range.data(), n, device_);
    const std::span<BFloat16> low(b.low.data(), range.size());
    if (zero_ == 0)
      b.reduce = reducer_.start(low);
    else
      b.scatter = group_.reduce_scatter_in_place_async(low);
    reduced_bytes_ += static_cast<std::int64_t>(low.size_bytes());
    // Per unit: the reduction reads only the rounded copy; the fp32 range goes back now.
    if (per_unit_) give_back(b);
  } else {
    if (zero_ == 0)
      b.reduce = reducer_.start(range);
    else
      b.scatter = group_.reduce_scatter_in_place_async(range);
    reduced_bytes_ += static_cast<std::int64_t>(range.size_bytes());
  }
  if (progress_thread()) {
    if (!thread_.joinable())
      thread_ = std::thread([this, rank = log::current_rank()] {
        log::set_thread_rank(rank);
        progress_loop();
      });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_.push_back(&b);
      ++handed_;
    }
    work_cv_.notify_one();
  }
}

bool GradReducer::poll(Bucket& b) { return zero_ == 0 ? b.reduce.test() : b.scatter.test(); }

void GradReducer::retire(Bucket& b) {
  b.scatter.wait();  // complete already: runs the completion step, if any, once
  const std::int64_t block = (b.hi - b.lo) / group_.size();
  const std::int64_t own = b.lo + group_.rank() * block;
  float* shard = shard_grads_.data() + b.shard_at;
  // The same sums as ZeRO-2's (widened, then added): bit for bit the same shard. On a GPU
  // they run on the compute stream, after the reduce-scatter (its wait orders them).
  if (options_.bf16) {
    Tensor<float> wide({block}, device_);
    ops::cast(wide.data(), b.low.data() + (own - b.lo), block, device_);
    ops::add(shard, wide.data(), block, device_);
    b.low = Tensor<BFloat16>();
  } else {
    ops::add(shard, grads_ + own, block, device_);
  }
  give_back(b);  // zeros (on the CPU the pages go back; in mappable device memory the chunks)
  b.retired = true;
}

void GradReducer::retire_done() {
  if (!progress_thread()) {
    for (std::size_t i = 0; i < next_; ++i)
      if (Bucket& b = buckets_[i]; !b.retired && poll(b)) retire(b);
    return;
  }
  // The thread drops a bucket from active_ once it saw it complete; then it is ours again.
  std::vector<Bucket*> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 0; i < next_; ++i)
      if (Bucket& b = buckets_[i]; !b.retired && std::find(active_.begin(), active_.end(), &b) == active_.end())
        done.push_back(&b);
  }
  for (Bucket* b : done) retire(*b);
}

void GradReducer::wait_in_flight() {
  const double t0 = now_s();
  if (progress_thread()) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] {
      if (thread_gave_up_) return true;  // finish_backward reports what stopped the thread
      for (std::size_t i = 0; i < next_; ++i)
        if (!buckets_[i].retired && std::find(active_.begin(), active_.end(), &buckets_[i]) != active_.end())
          return false;
      return true;
    });
    if (thread_gave_up_) return;
  } else {
    for (std::size_t i = 0; i < next_; ++i)
      if (!buckets_[i].retired) buckets_[i].scatter.wait();
  }
  exposed_seconds_ += now_s() - t0;
  retire_done();
}

void GradReducer::sample_workspace() {
  if (pages_) {
    peak_workspace_bytes_ = std::max(peak_workspace_bytes_, pages_->backed_bytes());
    return;
  }
  if (device_ != Device::kCpu) {  // device memory that is not mappable stays whole
    peak_workspace_bytes_ = flat_size_ * static_cast<std::int64_t>(sizeof(float));
    return;
  }
  static const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(grads_) / page * page;
  const auto end = reinterpret_cast<std::uintptr_t>(grads_ + flat_size_);
  const std::size_t pages = (end - begin + page - 1) / page;
  resident_.resize(pages);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, resident_.data()) != 0) return;
  std::int64_t n = 0;
  for (unsigned char c : resident_) n += c & 1;
  peak_workspace_bytes_ = std::max(peak_workspace_bytes_, n * static_cast<std::int64_t>(page));

}

void GradReducer::grads_final(std::int64_t from) {
  if (!reduce_now_) return;
  // Per unit: just after a unit's backward, before its reduction starts, is when the most
  // full-size gradients are resident (that unit's and the one still in flight).
  if (per_unit_) {
    sample_workspace();
    // FSDP's bound: the previous unit's reduce-scatter completes before this one's starts,
    // so the backward holds two units' full gradients at most, however far a peer lags.
    if (options_.overlap) wait_in_flight();
  }
  if (!options_.overlap) return;
  while (next_ < buckets_.size() && buckets_[next_].lo >= from) start(buckets_[next_++]);
  progress();
}

void GradReducer::progress() {
  if (!reduce_now_ || !options_.overlap) return;
  if (per_unit_) {  // polls, or asks the thread, and retires what completed
    retire_done();
    if (pages_) pages_->poll();
    return;
  }
  if (options_.progress_thread) return;  // the thread polls
  for (std::size_t i = 0; i < next_; ++i) poll(buckets_[i]);
}

void GradReducer::expire_if_stuck() {
  // The thread polled for timeout_s_ without a bucket completing: the timeout has already
  // passed, so the step's waits below must not start a second one (a dp reduction that
  // cannot complete was reported after twice NDMESH_TIMEOUT_S). A short grace, polling,
  // for a peer that arrived just now; then the job ends with the group's line.
  const auto grace = std::chrono::duration<double>(std::max(0.05, 0.1 * timeout_s_));
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    std::size_t stuck = buckets_.size();
    for (std::size_t k = 0; k < buckets_.size(); ++k)
      if (poll(buckets_[k])) --stuck;
    if (stuck == 0) return;
    if (std::chrono::steady_clock::now() - t0 > grace) {
      std::size_t first = 0;
      while (first < buckets_.size() && poll(buckets_[first])) ++first;
      group_.abort_job(comm::kTimeoutExitCode, "comm",
                       fmt::format("{}: gradient bucket {} of {} (and {} more) did not complete while the "
                                   "progress thread polled",
                                   group_.timeout_line(zero_ == 0 ? "all_reduce" : "reduce_scatter", timeout_s_),
                                   first, buckets_.size(), stuck - 1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void GradReducer::finish_backward() {
  if (!reduce_now_) return;
  const double t0 = now_s();
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  if (thread_.joinable()) {
    // Every bucket was handed to the thread: wait until it has seen them all complete.
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return active_.empty() || thread_gave_up_; });
    active_.clear();
    thread_gave_up_ = false;
    if (thread_error_) std::rethrow_exception(std::exchange(thread_error_, nullptr));
    if (std::exchange(thread_timed_out_, false)) {
      lock.unlock();
      expire_if_stuck();
    }
  }
  for (Bucket& b : buckets_) {
    if (per_unit_) {
      if (!b.retired) retire(b);
      continue;
    }
    if (zero_ == 0)
      b.reduce.wait();
    else
      b.scatter.wait();
    if (options_.bf16) {  // widen what this rank uses: the bucket, or under ZeRO its block
      std::int64_t lo = b.lo, hi = b.hi;
      if (zero_ > 0) {
        const std::int64_t block = (b.hi - b.lo) / group_.size();
        lo = b.lo + group_.rank() * block;
        hi = lo + block;
      }
      ops::cast(grads_ + lo, b.low.data() + (lo - b.lo), hi - lo, device_);
    }
  }
  const double t1 = now_s();
  exposed_seconds_ += t1 - t0;
  // From the first bucket's start to the last one's completion (buckets start in order).
  comm_seconds_ += t1 - buckets_.front().start_time;
  if (zero_ == 2 && !per_unit_) {
    // Add this rank's block of every bucket to the shard, and clear the work space.
    // On a GPU both live in device memory (ops run where the buffers are).
    std::int64_t at = 0;
    for (const nn::Segment& seg : shard_) {
      ops::add(shard_grads_.data() + at, grads_ + seg.offset, seg.count, device_);
      at += seg.count;
    }
    for (const Bucket& b : buckets_) ops::zero(grads_ + b.lo, b.hi - b.lo, device_);
  }
  reduce_now_ = false;  // until the next begin_backward: a backward in between reduces nothing
}

void GradReducer::gather_params(float* params) {
  if (!gathers_params()) return;
  std::vector<comm::Work> works;
  works.reserve(buckets_.size());
  for (const Bucket& b : buckets_)
    works.push_back(group_.all_gather_in_place_async(
        std::span<float>(params + b.lo, static_cast<std::size_t>(b.hi - b.lo))));
  comm::wait_all(works);
}

}  // namespace ndmesh::parallel
