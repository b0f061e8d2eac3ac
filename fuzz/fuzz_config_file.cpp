// TOML config files: load_config_file, then what the CLI does with the result (layout,
// resolve, validation with the model).
#include "fuzz_common.hpp"
#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ndmesh;
  const std::string path = fuzz::write_temp(data, size, ".toml");
  try {
    ConfigFile file = load_config_file(path);
    ParallelConfig c = file.parallel;
    c.dims = layout_dims(file.layout);
    c = resolve(c, c.world);
    (void)problems(c, file.model ? &*file.model : nullptr);
    if (file.model) (void)model_problems(*file.model);
  } catch (const ConfigError&) {
  } catch (const IoError&) {
  }
  ::unlink(path.c_str());
  return 0;
}
