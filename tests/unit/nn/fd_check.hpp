// Finite-difference gradient checks in double precision, shared by the nn and model tests.
//
// For every element x_i of a buffer: (L(x + h e_i) - L(x - h e_i)) / 2h against the
// analytic gradient. Central differences in double with h = 1e-5 are accurate to about
// 1e-10 here, so the tolerance can be tight (1e-7 relative).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::testing {

/// Fills n elements with N(0, scale) draws.
inline void fill_normal(double* x, std::int64_t n, Rng& rng, double scale = 1.0) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = scale * rng.normal();
}

/// n N(0, scale) draws.
inline std::vector<double> random_vector(std::int64_t n, Rng& rng, double scale = 1.0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  fill_normal(v.data(), n, rng, scale);
  return v;
}

/// Checks analytic[i] against the central difference of loss() in x[i], for all i < n.
/// Returns the largest |analytic| seen (callers assert it is not trivially zero).
inline double expect_gradient(const std::string& what, double* x, const double* analytic, std::int64_t n,
                              const std::function<double()>& loss, double h = 1e-5, double tol = 1e-7) {
  double largest = 0;
  int reported = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double fd = (up - down) / (2 * h);
    largest = std::max(largest, std::abs(analytic[i]));
    if (std::abs(fd - analytic[i]) > tol * (1.0 + std::abs(fd)) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " vs finite difference " << fd;
  }
  return largest;
}

/// Checks every parameter of a store (analytic gradients must already be in grads()).
inline void expect_param_gradients(ParamStore<double>& store, const std::function<double()>& loss) {
  for (const auto& view : store.views()) {
    double largest = expect_gradient(view.name, store.params().data() + view.offset,
                                     store.grads().data() + view.offset, view.numel, loss);
    EXPECT_GT(largest, 1e-6) << view.name << ": gradient is zero everywhere, the check proves nothing";
  }
}

/// sum_i a[i] * b[i]: the test loss L = <out, w> whose gradient in out is w.
inline double dot(const double* a, const double* b, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace ndmesh::testing
