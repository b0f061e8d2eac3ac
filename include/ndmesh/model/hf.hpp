// Hugging Face checkpoints in and out: a folder that transformers' save_pretrained writes
// (config.json and model.safetensors, or shards named by model.safetensors.index.json) for
// the model types gpt2 (GPT2LMHeadModel) and llama (LlamaForCausalLM).
//
// config.json becomes the architecture description (ModelSpec); a key the file leaves out
// takes transformers' default for its model type (GPT-2: tied head, n_inner 4 * n_embd,
// layer_norm_epsilon 1e-5; Llama: untied head, rms_norm_eps 1e-6, rope_theta 10000, kv heads
// = heads), and a feature ndmesh does not implement is refused naming the key.
//
// The tensors map name by name onto ndmesh's layout (Linear weights [out, in]):
//   GPT-2  wte/wpe -> embed.tokens/positions; h.L.ln_1/ln_2 -> block.L.ln1/ln2; Conv1D
//          weights ([in, out]: y = x W + b) transposed: attn.c_attn -> attn.qkv (its columns
//          are q | k | v, the rows of ndmesh's qkv), attn.c_proj -> attn.proj, mlp.c_fc ->
//          mlp.fc, mlp.c_proj -> mlp.proj; ln_f; lm_head (untied only).
//   Llama  embed_tokens; input_layernorm/post_attention_layernorm -> ln1/ln2; q/k/v_proj ->
//          the rows [q heads; k heads; v heads] of attn.qkv; o_proj -> attn.proj; gate/up_proj
//          -> the rows [gate; up] of mlp.fc; down_proj -> mlp.proj; norm -> ln_f; lm_head.
// Both use the rotate-half rotary convention of transformers' Llama, as ndmesh does, so no
// permutation. The checkpoints hold the real vocabulary rows only; ndmesh pads them when it
// builds the model, and export writes the real rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/config/config.hpp"

namespace ndmesh::model {

/// The file name of a folder's configuration.
inline constexpr const char* kHfConfigFile = "config.json";

/// A Hugging Face config.json (its path, for messages) as an architecture description.
/// ConfigError naming the file and the key: not JSON, an unknown model_type, a value of the
/// wrong kind, a feature ndmesh does not implement (attention or MLP biases in Llama, a
/// rope_scaling other than Llama 3's, another activation, ...), a description
/// model_problems() refuses.
ModelSpec hf_config_to_spec(const std::string& config_path);
/// The config.json (text) of `spec` for transformers: gpt2 or llama, as arch_name() says.
/// ConfigError naming the field when the description is neither family's layers exactly.
std::string hf_config_json(const ModelSpec& spec, const std::string& torch_dtype = "float32");

/// One tensor of a Hugging Face state dict and where it lives in ndmesh's.
struct HfTensor {
  std::string name;                 ///< e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<std::int64_t> shape;  ///< as stored in the Hugging Face file
  std::string ndmesh;               ///< the ndmesh tensor it is (part of)
  std::int64_t row = 0;             ///< its first row there (q/k/v and gate/up share one tensor)
  bool transpose = false;           ///< a GPT-2 Conv1D weight: stored [in, out]
};
/// One tensor of ndmesh's (logical, serial) state dict.
struct NdTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};
/// The two state dicts of `spec` and how they map: every ndmesh tensor (in the model's
/// order) is the concatenation along rows of the Hugging Face tensors that name it.
struct HfMapping {
  std::vector<NdTensor> ndmesh;
  std::vector<HfTensor> hf;
};
/// The mapping of a gpt2 or llama description (ConfigError as hf_config_json).
HfMapping hf_mapping(const ModelSpec& spec);

class SafetensorsFolder;

/// True when `path` is a folder holding config.json and no checkpoint manifest: a Hugging
/// Face folder that `ndmesh train --load` and `ndmesh eval --load` read directly.
bool is_hf_dir(const std::string& path);

/// A Hugging Face folder read as ndmesh's logical (serial, real vocabulary rows) tensors:
/// its config.json as the description, its safetensors mapped, each tensor read on demand
/// from the mapped files (import_hf reads each tensor whole; `--load HF_DIR` reads only the
/// blocks of its rank's slices, read_block).
class HfFolder {
 public:
  /// Reads config.json (hf_config_to_spec) and maps the safetensors. ConfigError naming the
  /// folder or file: not a folder, a bad config.json, no or a broken safetensors file.
  explicit HfFolder(const std::string& hf_dir);
  ~HfFolder();
  HfFolder(const HfFolder&) = delete;
  HfFolder& operator=(const HfFolder&) = delete;

  const std::string& dir() const { return dir_; }
  const ModelSpec& spec() const { return spec_; }
  const HfMapping& mapping() const { return map_; }
  /// Fills `values` (numel of t's shape) with ndmesh tensor `t` of mapping().ndmesh, from
  /// the Hugging Face tensors that make it (transposed, stacked). ConfigError naming the
  /// folder or file and the tensor: missing, or of another shape than config.json says.
  void read(const NdTensor& t, float* values);
  /// A block of ndmesh tensor `t` seen as a matrix [shape[0], numel / shape[0]] (a vector:
  /// [n, 1]): rows [row, row + rows), columns [col, col + cols), into `out` with `ld` floats
  /// from one row to the next. Reads only the bytes of the Hugging Face tensors that hold the
  /// block: the rows of the q/k/v or gate/up tensors it spans, and of a transposed (Conv1D)
  /// tensor the matching columns. Errors as read().
  void read_block(const NdTensor& t, std::int64_t row, std::int64_t rows, std::int64_t col, std::int64_t cols,
                  float* out, std::int64_t ld);
  /// The ndmesh tensor named `name`, or nullptr.
  const NdTensor* find(const std::string& name) const;
  /// Hugging Face tensors read so far (by read()).
  std::int64_t tensors_read() const { return tensors_read_; }
  /// Bytes of tensor data read from the files so far (by read() and read_block()).
  std::int64_t bytes_read() const;
  /// The folder's tensors that no read() has used (old buffers such as GPT-2's attn.bias).
  std::vector<std::string> unused() const;

 private:
  std::string dir_;
  ModelSpec spec_;
  HfMapping map_;
  std::unique_ptr<SafetensorsFolder> folder_;
  std::vector<std::string> used_;
  std::vector<float> part_;  // a transposed tensor as stored
  std::int64_t tensors_read_ = 0;
};

/// What import_hf did.
struct HfImportReport {
  ModelSpec spec;
  std::int64_t tensors = 0;          ///< Hugging Face tensors read
  std::int64_t parameters = 0;       ///< elements written
  std::vector<std::string> ignored;  ///< tensors of the file that no parameter reads (buffers)
};
/// Writes the Hugging Face folder HF_DIR as checkpoint directory CKPT_DIR (the serial
/// layout, weights only: step 0, no optimizer state, no data source; `ndmesh train --load`
/// starts a fresh run from it on any data and under any layout). Tensors are read one at a
/// time from the mapped files. The directory appears only when complete; an existing one is
/// refused unless `force`. ConfigError naming the file and the tensor or key for bad input.
HfImportReport import_hf(const std::string& hf_dir, const std::string& ckpt_dir, bool force = false);

/// Options of export_hf.
struct HfExportOptions {
  std::string dtype = "fp32";  ///< fp32 or bf16
  bool force = false;          ///< replace an existing HF_DIR
  /// Files above this many bytes are split into shards with an index (transformers' 5 GB).
  std::int64_t max_shard_bytes = 5'000'000'000;
};
/// What export_hf wrote.
struct HfExportReport {
  ModelSpec spec;
  std::int64_t files = 0;
  std::int64_t bytes = 0;
};
/// Writes checkpoint directory CKPT_DIR as a Hugging Face folder HF_DIR: config.json and
/// model.safetensors (or shards and model.safetensors.index.json), with the __metadata__
/// {"format": "pt"} transformers expects; the real vocabulary rows only. The folder appears
/// only when complete. ConfigError for bad input (an existing HF_DIR without force, a
/// description that is not GPT-2 or Llama, a bad dtype), IoError for a corrupt checkpoint.
HfExportReport export_hf(const std::string& ckpt_dir, const std::string& hf_dir,
                         const HfExportOptions& options);

}  // namespace ndmesh::model
