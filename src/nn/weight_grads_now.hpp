// WeightGradsNow: a scope in which Linear::backward computes its weight gradient at once,
// even inside a DeferWeightGrads scope (linear.hpp). For layers whose inputs do not outlive
// their backward: a mixture of experts gathers each expert's rows into buffers of its own
// backward, so a deferred weight gradient (which keeps a pointer to its input until the
// zero-bubble schedules' W pass) would read freed memory. The gradients are the same sums;
// only when they are added changes (in B instead of W). Private to src/nn.
#pragma once

#include "ndmesh/nn/linear.hpp"

namespace ndmesh::nn {

template <typename T>
class WeightGradsNow {
 public:
  WeightGradsNow();
  ~WeightGradsNow();
  WeightGradsNow(const WeightGradsNow&) = delete;
  WeightGradsNow& operator=(const WeightGradsNow&) = delete;

 private:
  DeferredWeightGrads<T>* previous_;
};

}  // namespace ndmesh::nn
