// cuda::cross_entropy_forward / backward against nn::CrossEntropy (one rank holds the
// whole vocabulary): probabilities into their own buffer and in place over the logits,
// the per-row losses, the mean, and the gradient accumulated into a filled buffer.
//
// The forward's reference is the double twin, CrossEntropy<double>, on the same inputs:
// the float twin's sequential sum of exp(z - max) drops every term below half an ulp of
// the running sum, and with spread logits (std 4) over 50304 entries that loses 7e-5 of
// the sum (measured in the emulator: the kernel's tree of partial sums is closer to the
// double result than the float loop is). The backward's reference is the float twin.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/cross_entropy.hpp"
#include "ndmesh/nn/cuda_ops.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

TEST(CudaCrossEntropy, ForwardAndBackwardMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  for (std::int64_t rows : {1, 7, 33})
    for (std::int64_t vocab : {5, 1031, 50304})
      for (bool in_place : {false, true}) {
        if (rows * vocab > 33 * 1031 && rows > 7) continue;  // keep it to milliseconds
        const auto sz = static_cast<std::size_t>(rows * vocab);
        const auto logits = normal(sz, 1, 4.0f);
        Rng rng(2);
        std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
        for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
        std::vector<float> probs(sz), losses(targets.size());
        nn::CrossEntropy<float>::forward(logits.data(), targets.data(), probs.data(), losses.data(), rows,
                                         vocab);
        const std::vector<double> logits64(logits.begin(), logits.end());
        std::vector<double> probs64(sz), losses64(targets.size());
        const double mean = nn::CrossEntropy<double>::forward(logits64.data(), targets.data(), probs64.data(),
                                                              losses64.data(), rows, vocab);
        const std::vector<float> probs_ref(probs64.begin(), probs64.end()),
            losses_ref(losses64.begin(), losses64.end());

        DeviceBuffer dlogits = to_device(logits), dtargets = to_device(targets);
        DeviceBuffer dprobs_own = to_device(nans(sz)), dlosses = to_device(nans(losses.size()));
        float* dprobs = in_place ? ptr<float>(dlogits) : ptr<float>(dprobs_own);
        cuda::cross_entropy_forward(dprobs, ptr<float>(dlosses), ptr<float>(dlogits), ptr<std::int32_t>(dtargets),
                                    rows, vocab);
        // The mean as the training step reads it: the losses summed on the device (sum_into).
        DeviceBuffer acc = to_device(std::vector<double>{0.5});
        cuda::sum_into(ptr<double>(acc), ptr<float>(dlosses), rows);
        const double got_mean = (to_host<double>(acc, 1)[0] - 0.5) / static_cast<double>(rows);
        std::vector<float> got_probs(sz);
        cuda::copy_to_host(got_probs.data(), dprobs, sz * sizeof(float));
        const std::string where = "rows=" + std::to_string(rows) + " vocab=" + std::to_string(vocab) +
                                  (in_place ? " in place" : "");
        // Float exp (expf within 2 ulp) and a float sum in a tree of partial sums (about
        // eps log2(vocab) relative): probabilities within 1e-5 relative of the double
        // result, and the losses, log(sum) minus the same difference, within 1e-5
        // absolute. A wrong max, target or alias is off by far more.
        EXPECT_TRUE(all_close(got_probs, probs_ref, 1e-12, 1e-5)) << "probs " << where;
        EXPECT_TRUE(all_close(to_host<float>(dlosses, losses.size()), losses_ref, 1e-5, 1e-6))
            << "losses " << where;
        EXPECT_NEAR(got_mean, mean, 1e-5) << "mean loss " << where;

        // The backward from the CPU's probabilities, into a filled gradient. The same two
        // float operations per element (p * scale then + d, then - scale at the target), no
        // FMA: equal, with one ulp allowed for a host build that contracts into an FMA.
        const auto dgrad0 = normal(sz, 3);
        std::vector<float> dgrad = dgrad0;
        const float scale = 1.0f / static_cast<float>(rows);
        nn::CrossEntropy<float>::backward(probs.data(), targets.data(), dgrad.data(), rows, vocab, scale);
        DeviceBuffer dp = to_device(probs), dg = to_device(dgrad0);
        cuda::cross_entropy_backward(ptr<float>(dg), ptr<float>(dp), ptr<std::int32_t>(dtargets), rows, vocab,
                                     scale);
        EXPECT_TRUE(all_close(to_host<float>(dg, sz), dgrad, 0, 1.2e-7)) << "dlogits " << where;

        // In place (dlogits is probs, what the model does): what adding into zeros gives, bit
        // for bit, on the CPU and on the device.
        std::vector<float> zeros_ref(sz, 0.0f), over_probs = probs;
        nn::CrossEntropy<float>::backward(probs.data(), targets.data(), zeros_ref.data(), rows, vocab, scale);
        nn::CrossEntropy<float>::backward(over_probs.data(), targets.data(), over_probs.data(), rows, vocab, scale);
        EXPECT_TRUE(same_bits(over_probs, zeros_ref)) << "in place on the CPU " << where;
        cuda::cross_entropy_backward(ptr<float>(dp), ptr<float>(dp), ptr<std::int32_t>(dtargets), rows, vocab, scale);
        EXPECT_TRUE(same_bits(to_host<float>(dp, sz), zeros_ref)) << "in place on the device " << where;
      }
}

}  // namespace
}  // namespace ndmesh
