#include "ndmesh/parallel/parallelize.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/config/training.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh::parallel {

std::vector<std::string> unsupported_layout(const Mesh& mesh) {
  std::vector<std::string> out;
  // ndmesh train folds --ep into dp x cp (parallel/ep/apply.cpp): a dim named ep (--dims) is not that.
  if (mesh.size_of("ep") > 1)
    out.push_back(fmt::format("--ep={} as a dim of its own: ndmesh train folds expert parallelism into dp x cp; "
                              "give --ep with --dp and a MoE model (--experts N), not in --dims or --order",
                              mesh.size_of("ep")));
  for (const Dim& d : mesh.dims())
    if (d.size > 1 && d.name != "dp" && d.name != "tp" && d.name != "pp" && d.name != "cp" && d.name != "ep")
      out.push_back(fmt::format("dim {}={}: ndmesh train knows the dims dp, pp, cp, tp; rename it or give it size 1",
                                d.name, d.size));
  return out;
}

RankModel parallelize(const TrainOptions& o, ProcessGroups& groups) {
  // Mixture of experts: serial, dp, ep (folded into dp x cp), pp (every schedule), cp, tp
  // (experts split over tp) and ZeRO 1-3 (docs/models.md).
  const Mesh& mesh = groups.mesh();
  NDMESH_CHECK_CONFIG(o.model.experts == 0 || o.model.expert_ffn_or_default() % mesh.size_of("tp") == 0, "train",
                      "--expert-ffn={} is not divisible by --tp={} (each expert is split over tp); use an expert "
                      "width that tp divides",
                      o.model.expert_ffn_or_default(), mesh.size_of("tp"));
  if (auto problems = unsupported_layout(groups.mesh()); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  if (auto problems = train_option_problems(o); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  // The rules of running this model on this layout (config/training.hpp), the same ones
  // `ndmesh plan` and `ndmesh mesh --config` apply: batch over dp and micro-batches, cp
  // chunks, tp splits, sequence parallelism, schedule and virtual stages, zb-h1 without
  // recompute, ZeRO stage, a block per pipeline chunk.
  const TrainingRun run{.dp = groups.dp().size(),
                        .cp = groups.cp().size(),
                        .tp = groups.tp().size(),
                        .pp = groups.pp().size(),
                        .vpp = o.pp.virtual_stages,
                        .schedule = o.pp.schedule,
                        .global_batch = o.batch,
                        .micro_batch = o.micro_batch,
                        .sequence_parallel = o.sequence_parallel,
                        .recompute = o.recompute != nn::Recompute::kNone,
                        .zero = o.dp.zero,
                        .cp_contiguous = o.cp_layout == CpLayout::kContiguous,
                        .pp_layers_entries = o.pp.layers.empty()
                                                 ? 0
                                                 : static_cast<std::int64_t>(
                                                       std::count(o.pp.layers.begin(), o.pp.layers.end(), ',') + 1)};
  if (auto problems = training_problems(run, &o.model); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));

  RankModel m;
  ModelPlan& plan = m.plan;
  plan.spec = o.model;
  plan.seed = o.seed;
  plan.batch = make_batch_layout(o, groups.dp(), groups.cp());
  // NDMESH_TEST_LOSS_SCALE: a deliberately wrong weight for the tests that must catch it.
  plan.loss_weight = env::number("NDMESH_TEST_LOSS_SCALE", 1.0) / static_cast<double>(o.batch * o.model.seq);
  plan.pp = groups.world().self("pp");
  plan.grad_group = groups.world().self("dp");
  plan.expert_data = groups.world().self("edp");

  apply_tensor_parallel(plan, groups, o);
  apply_context_parallel(plan, groups, o);
  apply_expert_parallel(plan, groups, o);
  apply_pipeline_parallel(plan, groups, o);
  apply_data_parallel(plan, groups, o);
  apply_recompute(plan, o);
  apply_device(plan, groups, o);
  plan.matmul = o.precision == Precision::kBf16 ? MatmulPrecision::kBf16 : MatmulPrecision::kFp32;

  m.chunks = build_chunks(plan);
  return m;
}

std::vector<std::unique_ptr<model::Model>> build_chunks(const ModelPlan& plan) {
  std::vector<std::unique_ptr<model::Model>> chunks;
  for (const ChunkPlan& c : plan.chunks) {
    chunks.push_back(model::build<float>(
        plan.spec,
        {.seed = plan.seed,
         .batch = plan.batch.micro_batch,
         .seq = plan.batch.local_seq(),
         .recompute = plan.recompute,
         .device = plan.device,
         .matmul = plan.matmul,
         .fuse_closing_add = plan.fuse_closing_add,
         .ep = plan.ep,
         .shard_experts = plan.shard_experts},
        model::UnitRange::blocks(c.first_block, c.last_block, plan.spec.layers), plan.tp, plan.store));
    model::Model& g = *chunks.back();
    // bf16 products on a GPU read the weights from a bfloat16 copy that the optimizer step
    // writes with the update. Not under ZeRO-3: its gathers write the fp32 parameters, and a
    // full-size copy would undo the sharding, so each product rounds its (gathered) weight
    // itself (nn::Linear: the same values; what `ndmesh plan` assumes too). GradSync checks.
    if (plan.device == Device::kCuda && plan.matmul == MatmulPrecision::kBf16 && !plan.store.mappable_params)
      g.params().keep_bf16_copy();
    // The chunks of a rank run one backward at a time: one recompute workspace for all.
    if (chunks.size() > 1) g.share_recompute_workspace(*chunks.front());
    g.set_loss_weight(plan.loss_weight);
    if (plan.batch.cp_size > 1) g.set_positions(plan.batch.positions);
    if (plan.ring) g.set_attention_core(plan.ring);
  }
  return chunks;
}

}  // namespace ndmesh::parallel
