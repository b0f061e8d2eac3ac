// The checkpoint-directory reader: the bytes as DIR/manifest.json, then read_manifest(DIR)
// and, when it is accepted, a verify (whose shard files are missing or too short).
#include <filesystem>

#include "fuzz_common.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ndmesh;
  const std::string dir = "/tmp/ndmesh-fuzz-ckdir-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string written = fuzz::write_temp(data, size, ".manifest");
  std::filesystem::rename(written, dir + "/manifest.json");
  try {
    const model::Manifest m = model::read_manifest(dir);
    (void)model::verify_checkpoint_dir(dir, m);
  } catch (const IoError&) {
  }
  std::filesystem::remove_all(dir);
  return 0;
}
