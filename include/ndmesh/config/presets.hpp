// Model presets: names for architecture descriptions, one table for `ndmesh train --model`,
// `ndmesh plan --model`, the TOML [model] name and Python.
//
// Published shapes, each with its source: the GPT models of Narayanan et al. 2021 (Table 1;
// vocab 51200, seq 2048), GPT-3 175B (Brown et al. 2020), BLOOM 176B, GPT-2 (Radford et al.
// 2019, the Hugging Face configs: vocab 50257, 1024 positions), Llama 2 (Touvron et al. 2023)
// and Llama 3 (Llama Team 2024). And small models for tests and first runs (gpt2-tiny,
// llama-tiny), which train in seconds on a laptop.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/config/config.hpp"

namespace ndmesh {

/// One model preset.
struct ModelPreset {
  std::string name;
  std::string source;  ///< where the shape is published ("" for the small test models)
  ModelSpec spec;      ///< spec.name is the preset's name
  /// Whether the published run kept dropout masks (the planner counts their memory; ndmesh
  /// trains without dropout).
  bool dropout = false;
};

/// Every model preset, in the order they are listed to users.
const std::vector<ModelPreset>& model_presets();
/// The named preset; ConfigError naming `flag`, the value and the valid names otherwise.
const ModelPreset& model_preset(std::string_view name, std::string_view flag = "--model");
/// "gpt3-1.7b, gpt3-3.6b, ..." for messages.
std::string model_preset_names();

}  // namespace ndmesh
