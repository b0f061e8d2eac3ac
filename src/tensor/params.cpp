#include "ndmesh/tensor/params.hpp"

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh {

template <typename T>
int ParamStore<T>::add(std::string name, std::vector<std::int64_t> shape, bool decay, ParamShard shard) {
  NDMESH_CHECK(params_.numel() == 0, "nn", "parameter '{}' declared after the store was allocated", name);
  NDMESH_CHECK(find(name) < 0, "nn", "parameter '{}' declared twice", name);
  std::int64_t numel = shape_numel(shape);
  NDMESH_CHECK(numel > 0, "nn", "parameter '{}' has no elements", name);
  if (shard.dim >= 0) {
    NDMESH_CHECK(shard.full_shape.size() == shape.size() && shard.dim < static_cast<int>(shape.size()), "nn",
                 "parameter '{}' has a shard along dim {} of a {}-d full shape", name, shard.dim,
                 shard.full_shape.size());
    std::int64_t along = 0;
    for (const auto& p : shard.pieces) along += p.length;
    NDMESH_CHECK(along == shape[static_cast<std::size_t>(shard.dim)], "nn",
                 "parameter '{}': shard pieces hold {} along dim {} but the local shape has {}", name, along,
                 shard.dim, shape[static_cast<std::size_t>(shard.dim)]);
  }
  std::int64_t& end = in_experts_ ? expert_size_ : size_;
  views_.push_back({std::move(name), end, std::move(shape), numel, decay, std::move(shard)});
  views_.back().expert = in_experts_;
  end += (numel + kParamAlign - 1) / kParamAlign * kParamAlign;
  return static_cast<int>(views_.size()) - 1;
}

template <typename T>
void ParamStore<T>::set_tied(int id, Tied tied) {
  NDMESH_CHECK(params_.numel() == 0, "nn", "parameter '{}' marked tied after the store was allocated",
               views_.at(static_cast<std::size_t>(id)).name);
  views_.at(static_cast<std::size_t>(id)).tied = tied;
}

template <typename T>
void ParamStore<T>::align_to(std::int64_t multiple) {
  NDMESH_CHECK(params_.numel() == 0, "nn", "parameter store aligned after it was allocated");
  NDMESH_CHECK(multiple >= 1, "nn", "alignment {} must be at least 1", multiple);
  const std::int64_t m = std::lcm(multiple, kParamAlign);
  size_ = (size_ + m - 1) / m * m;
}

template <typename T>
void ParamStore<T>::begin_experts() {
  NDMESH_CHECK(params_.numel() == 0 && !in_experts_, "nn",
               "the expert partition is opened once at a time and before the store is allocated");
  in_experts_ = true;
  if (options_.pad_units) {  // each expert unit splits into equal shards over edp
    const std::int64_t m = std::lcm(std::max<std::int64_t>(1, options_.expert_pad_to), kParamAlign);
    expert_size_ = (expert_size_ + m - 1) / m * m;
  }
  expert_starts_.push_back(expert_size_);
}

template <typename T>
std::vector<std::int64_t> ParamStore<T>::expert_unit_offsets() const {
  std::vector<std::int64_t> out = expert_starts_;
  if (params_.numel() > 0)
    for (std::int64_t& o : out) o += expert_offset_;
  return out;
}

template <typename T>
void ParamStore<T>::end_experts() {
  NDMESH_CHECK(in_experts_, "nn", "end_experts() without begin_experts()");
  in_experts_ = false;
}

template <typename T>
void ParamStore<T>::allocate(std::int64_t multiple) {
  NDMESH_CHECK(params_.numel() == 0, "nn", "parameter store allocated twice");
  NDMESH_CHECK(!in_experts_, "nn", "parameter store allocated inside begin_experts()");
  if (multiple == 0) multiple = options_.pad_to;
  NDMESH_CHECK(multiple >= 1, "nn", "padding multiple {} must be at least 1", multiple);
  // With an expert partition behind it, the dense part ends aligned too (its views' offsets
  // are kParamAlign multiples, as every view's).
  const std::int64_t dense_multiple = expert_size_ > 0 ? std::lcm(multiple, kParamAlign) : multiple;
  size_ = (size_ + dense_multiple - 1) / dense_multiple * dense_multiple;
  expert_offset_ = size_;
  if (expert_size_ > 0) {
    const std::int64_t m = std::max<std::int64_t>(1, options_.expert_pad_to);
    for (ParamView& v : views_)
      if (v.expert) v.offset += expert_offset_;
    size_ += (expert_size_ + m - 1) / m * m;
  }
  params_.resize({size_});
  grads_.resize({size_});
}

template <typename T>
void ParamStore<T>::to(Device device, bool mappable_params, bool mappable_grads) {
  if (device == params_.device()) return;
  ops::check_device<T>(device);
  NDMESH_CHECK(params_.device() == Device::kCpu, "nn", "a parameter store is placed once, from the host");
  // The host buffer itself is the source (no copy of it): under ZeRO-3 only its kept ranges
  // were ever written, the rest are untouched zero pages that nothing reads.
  const Tensor<T> host = std::move(params_);
  params_ = Tensor<T>();
  params_.set_device(device, mappable_params);
  params_.resize({size_});
  grads_.set_device(device, mappable_grads);
  if (keeps_bf16_copy()) params16_.set_device(device);
  bf16_current_ = false;
  if (!params_.mappable()) return params_from_host(host.data());
  // Mappable: the kept ranges' chunks are backed and written, nothing else.
  std::vector<Range> ranges = kept_;
  if (ranges.empty()) ranges.push_back({0, size_});
  const auto chunk = static_cast<std::int64_t>(cuda::map_granularity() / sizeof(T));
  T* const base = params_.data();
  for (const Range& k : ranges) {
    if (k.count <= 0) continue;
    NDMESH_CHECK(k.offset >= 0 && k.offset + k.count <= size_, "nn", "kept range [{}, {}) outside the {} parameters",
                 k.offset, k.offset + k.count, size_);
    // map_pages backs the chunks wholly inside its range: the range is widened to chunks.
    const std::int64_t lo = k.offset / chunk * chunk, hi = (k.offset + k.count + chunk - 1) / chunk * chunk;
    cuda::map_pages(base + lo, static_cast<std::size_t>(hi - lo) * sizeof(T));
    cuda::copy_to_device(base + k.offset, host.data() + k.offset, static_cast<std::size_t>(k.count) * sizeof(T));
  }
}

template <typename T>
void ParamStore<T>::keep_blocks(const std::vector<Range>& units) {
  NDMESH_CHECK(allocated(), "nn", "the kept blocks asked for before the store was allocated");
  kept_.clear();
  if (options_.keep_parts <= 1) return;  // every element is kept
  // Block `part` of `parts` equal blocks of every range.
  auto keep = [this](const std::vector<Range>& ranges, std::int64_t parts, std::int64_t part, const char* what) {
    for (const Range& r : ranges) {
      NDMESH_CHECK(r.count % parts == 0, "nn", "{} range [{}, {}) does not split into {} equal blocks", what,
                   r.offset, r.offset + r.count, parts);
      const std::int64_t block = r.count / parts;
      kept_.push_back({r.offset + part * block, block});
    }
  };
  keep(units, options_.keep_parts, options_.keep_part, "unit");
  if (expert_offset_ == size_) return;
  if (options_.expert_keep_parts <= 1) {  // the rank's experts whole
    kept_.push_back({expert_offset_, size_ - expert_offset_});
    return;
  }
  keep(expert_unit_ranges(), options_.expert_keep_parts, options_.expert_keep_part, "expert");
}

template <typename T>
std::vector<typename ParamStore<T>::Range> ParamStore<T>::expert_unit_ranges() const {
  std::vector<Range> out;
  const std::vector<std::int64_t> starts = expert_unit_offsets();
  for (std::size_t k = 0; k < starts.size(); ++k)
    out.push_back({starts[k], (k + 1 < starts.size() ? starts[k + 1] : size_) - starts[k]});
  return out;
}

template <typename T>
void ParamStore<T>::keep_bf16_copy() {
  NDMESH_CHECK(allocated(), "nn", "a bfloat16 copy of the parameters asked for before the store was allocated");
  if (keeps_bf16_copy() || size_ == 0) return;
  params16_ = Tensor<BFloat16>({size_}, params_.device());
  bf16_current_ = false;
}

template <typename T>
void ParamStore<T>::refresh_bf16() {
  if (!keeps_bf16_copy() || bf16_current_) return;
  if constexpr (std::is_same_v<T, float>) {
    ops::cast(params16_.data(), params_.data(), size_, params_.device());
  } else {  // double: the CPU only, rounded through float as the bf16 products round it
    for (std::int64_t i = 0; i < size_; ++i) params16_.data()[i] = BFloat16(static_cast<float>(params_.data()[i]));
  }
  bf16_current_ = true;
  ++bf16_refreshes_;
}

template <typename T>
void ParamStore<T>::params_from_host(const T* host) {
  bf16_current_ = false;
  if (params_.device() == Device::kCpu)
    std::copy(host, host + size_, params_.data());
  else
    cuda::copy_to_device(params_.data(), host, static_cast<std::size_t>(size_) * sizeof(T));
}

template <typename T>
int ParamStore<T>::find(std::string_view name) const {
  for (std::size_t i = 0; i < views_.size(); ++i)
    if (views_[i].name == name) return static_cast<int>(i);
  return -1;
}

template <typename T>
std::int64_t ParamStore<T>::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& v : views_) n += v.numel;
  return n;
}

template <typename T>
void ParamStore<T>::zero_grad() {
  grads_.zero();
}

template <typename T>
std::vector<std::int64_t> ParamStore<T>::logical_offsets(std::int64_t* total) const {
  std::vector<std::int64_t> out;
  std::int64_t at = 0;
  for (const auto& v : views_) {
    out.push_back(at);
    at += (v.full_numel() + kParamAlign - 1) / kParamAlign * kParamAlign;
  }
  if (total) *total = at;
  return out;
}

std::int64_t ParamView::full_numel() const { return shard.dim >= 0 ? shape_numel(shard.full_shape) : numel; }

template <typename T>
void copy_shard(const ParamShard& shard, const std::vector<std::int64_t>& local_shape, T* local, T* full,
                bool to_full, int rank) {
  if (shard.dim < 0) {
    const std::int64_t n = shape_numel(local_shape);
    if (to_full)
      std::copy(local, local + n, full);
    else
      std::copy(full, full + n, local);
    return;
  }
  const int r = rank >= 0 ? rank : shard.rank;
  const auto d = static_cast<std::size_t>(shard.dim);
  // Row-major: outer = product of dims before d, inner = product after d.
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < d; ++i) outer *= shard.full_shape[i];
  for (std::size_t i = d + 1; i < shard.full_shape.size(); ++i) inner *= shard.full_shape[i];
  const std::int64_t full_along = shard.full_shape[d], local_along = local_shape[d];
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t at = 0;  // along the local dim
    for (const auto& p : shard.pieces) {
      const std::int64_t start = p.start + static_cast<std::int64_t>(r) * p.length;
      // A piece may run past the full tensor's end: those local rows are padding (zero).
      const std::int64_t valid = std::clamp<std::int64_t>(full_along - start, 0, p.length);
      T* f = full + (o * full_along + start) * inner;
      T* l = local + (o * local_along + at) * inner;
      if (to_full) {
        std::copy(l, l + valid * inner, f);
      } else {
        std::copy(f, f + valid * inner, l);
        std::fill(l + valid * inner, l + p.length * inner, T(0));
      }
      at += p.length;
    }
  }
}

std::int64_t ParamShard::held_along(std::int64_t local_along) const {
  if (dim < 0) return local_along;
  std::int64_t held = 0;
  for (const auto& p : pieces) {
    const std::int64_t start = p.start + static_cast<std::int64_t>(rank) * p.length;
    held += std::clamp<std::int64_t>(full_shape[static_cast<std::size_t>(dim)] - start, 0, p.length);
  }
  return held;
}

template void copy_shard<float>(const ParamShard&, const std::vector<std::int64_t>&, float*, float*, bool,
                                int);
template void copy_shard<double>(const ParamShard&, const std::vector<std::int64_t>&, double*, double*, bool,
                                 int);

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace ndmesh
