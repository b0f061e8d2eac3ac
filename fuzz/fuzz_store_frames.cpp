// The TCP store's server protocol (StoreCore): bytes from three clients, as the socket
// loop would hand them over. Each input is a sequence of chunks: one byte picks the client
// (and, every so often, closes it or reads its replies), one byte the chunk's length, then
// the chunk. Bounds are PyTorch's, except the store and queue totals, kept small so that
// the fuzzer stays inside its memory limit; a dropped client is reopened.
#include <string>

#include "fuzz_common.hpp"
#include "ndmesh/launch/store_protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ndmesh::launch::detail;
  StoreLimits limits;
  limits.frame_bytes = std::size_t{1} << 20;
  limits.queued_bytes = std::size_t{1} << 20;
  limits.stored_bytes = std::size_t{4} << 20;
  limits.connections = 3;
  StoreCore core(limits);
  for (int id = 0; id < 3; ++id) core.open(id);
  std::size_t at = 0;
  while (at + 2 <= size) {
    const int id = data[at] % 3;
    const int action = data[at] / 3 % 8;
    std::size_t n = data[at + 1];
    at += 2;
    if (action == 7) {  // the client hangs up; a new one takes its place
      core.close(id);
      if (!core.open(id)) __builtin_trap();
      continue;
    }
    if (action == 6) {  // the client reads its replies
      core.sent(id, core.output(id).size());
      continue;
    }
    n = std::min(n, size - at);
    std::string why;
    if (!core.receive(id, reinterpret_cast<const char*>(data + at), n, why)) {
      if (why.empty()) __builtin_trap();  // a drop always says why
      core.close(id);
      core.open(id);
    }
    // A wait completed by another client adds one byte past the bound at most.
    if (core.output(id).size() > limits.queued_bytes + 1) __builtin_trap();
    at += n;
  }
  return 0;
}
