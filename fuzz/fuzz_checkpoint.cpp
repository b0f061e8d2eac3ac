// The checkpoint reader: model::load_checkpoint(path) on arbitrary bytes.
#include "fuzz_common.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ndmesh;
  const std::string path = fuzz::write_temp(data, size, ".ckpt");
  try {
    (void)model::load_checkpoint(path);
  } catch (const ConfigError&) {
  } catch (const IoError&) {
  }
  ::unlink(path.c_str());
  return 0;
}
