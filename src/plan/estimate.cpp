// Memory per GPU and time per step of one layout.
//
// Memory follows Korthikanti et al. 2022 section 4 (activations, micro-batches in flight,
// embedding and output-layer extras) and Rajbhandari et al. 2020 (model states). Time is a
// sum of terms per layer and micro-batch on the slowest pipeline rank (formulas.hpp has the
// closed forms and their sources):
//   compute               weight products (3 kernels per matrix, each F / rate + the measured
//                         per-kernel overhead: narrow tp splits and short sequences run below
//                         the rate) and the attention core (causal flash: half the FLOPs);
//                         the last rank adds the output layer
//   recompute             what the recompute mode re-runs (and flash's Q K^T)
//   memory                memory-bound work at the HBM bandwidth: standard attention's
//                         s x s scores, the loss over the vocabulary (last rank), the
//                         embedding (first rank)
//   tp                    4 all-reduces of b (s/cp) h activations per layer and micro-batch
//                         (2 forward, 2 backward; 6 with full recompute; Shoeybi et al. 2019
//                         section 3), ring 2(t-1) latency + 2(t-1)/t x bytes / bandwidth
//   cp                    ring attention (Liu et al. 2023): per step, one K/V block (latency +
//                         bytes / bandwidth) against one block pair's attention; only the
//                         excess of each step counts (few tokens per rank: mostly exposed)
//   pp                    one activation send forward and one gradient send backward per
//                         micro-batch and virtual stage, latency + bytes / bandwidth (split by
//                         tp with sequence parallelism, Narayanan et al. 2021 section 4.1)
//   bubble                (everything above) x bubble fraction
//   dp                    gradient reduction over dp x cp (ring: 2(d-1)/d x bytes; ZeRO-2
//                         reduce-scatters every micro-batch; ZeRO-3 also all-gathers the
//                         weights twice per micro-batch: Rajbhandari et al. section 7),
//                         overlapped with the backward pass it follows: the last
//                         micro-batch's backward for ZeRO 0/1, every backward for ZeRO-2,
//                         every forward and backward for ZeRO-3 (none without dp_overlap:
//                         Megatron-LM 2021 all-reduces after the pipeline flush). Only the
//                         excess counts.
// The bandwidth and latency of each term are intra-node when the Mesh says every group of
// that dim lies inside one node, inter-node otherwise.
#include "ndmesh/plan/estimate.hpp"

#include <algorithm>
#include <cmath>

#include "ndmesh/config/partition.hpp"
#include "ndmesh/mesh/mesh.hpp"
#include "units.hpp"

namespace ndmesh::plan {
namespace {

using units::d;

// Mixture-of-experts blocks on each pipeline rank: chunk k (contiguous blocks, in order) on
// rank k mod pp, as blocks_per_rank counts them.
std::vector<std::int64_t> moe_blocks_per_rank(const ModelSpec& spec, const std::vector<std::int64_t>& chunks,
                                              std::int64_t pp) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(std::max<std::int64_t>(pp, 1)), 0);
  std::int64_t first = 0;
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    out[k % out.size()] += moe_layers_in(spec, first, chunks[k]);
    first += chunks[k];
  }
  return out;
}

}  // namespace

ParallelConfig parallel_config(const Layout& l, const Workload& w, std::int64_t gpus_per_node) {
  ParallelConfig c;
  c.dims = {{"dp", l.dp}, {"pp", l.pp}, {"cp", l.cp}, {"tp", l.tp}};
  c.world = l.gpus();
  c.ranks_per_node = gpus_per_node;
  c.schedule = l.schedule;
  c.vpp = l.vpp;
  c.sequence_parallel = l.sequence_parallel;
  c.recompute = l.recompute != Recompute::kNone;
  c.zero = l.zero;
  c.micro_batch = l.micro_batch;
  c.global_batch = w.global_batch;
  c.folded_ep = l.ep;
  c.uneven_stages = true;  // the planner splits blocks with balanced_partition()
  return c;
}

std::vector<std::int64_t> stage_chunks(const PlanModel& model, const Layout& l) {
  if (!l.stage_layers.empty()) return l.stage_layers;
  return balanced_partition(model.spec.layers, l.pp, std::max<std::int64_t>(l.vpp, 1));
}

std::int64_t microbatches(const Layout& l, const Workload& w) {
  const std::int64_t per_step = l.micro_batch * l.dp;
  return per_step > 0 ? std::max<std::int64_t>(w.global_batch / per_step, 1) : 1;
}

MemoryBreakdown estimate_memory(const PlanModel& model, const Layout& l, const Workload& w,
                                const Precision& precision) {
  const double h = d(model.spec.hidden);
  // The vocabulary as ndmesh stores it: padded to a multiple of 64 and of tp (ModelSpec).
  const double vocab = d(model.spec.padded_vocab(l.tp));
  const double t = d(l.tp);
  const double s = d(w.seq) / d(l.cp);  // context parallelism divides the sequence
  const double b = d(l.micro_batch);
  const double sp = l.sequence_parallel ? t : 1.0;
  const std::int64_t m = microbatches(l, w);
  const std::vector<std::int64_t> ranks = blocks_per_rank(stage_chunks(model, l), l.pp);

  const ActivationOptions act{.tp = l.tp,
                              .sequence_parallel = l.sequence_parallel,
                              .recompute = l.recompute,
                              .activation_bytes = precision.activation_bytes,
                              .attention = l.attention,
                              .mlp_hidden_bytes = precision.mlp_hidden_bytes,
                              .mlp_pre_activation_bytes = precision.mlp_pre_activation_bytes,
                              .norm_output_bytes = precision.norm_output_bytes,
                              .attention_output_bytes = precision.attention_output_bytes,
                              .attention_input_bytes = precision.attention_input_bytes};
  const double per_layer = activation_bytes_per_layer(model, s, b, act);
  const double layer_params = layer_parameters_per_rank(model, l.tp);
  // A mixture of experts' layer: its MLP is the active experts' (moe_block_view), and the
  // rank stores E/ep of the routed experts (the target design: `ndmesh train` keeps them all).
  const bool has_moe = model.spec.experts > 0;
  ActivationOptions moe_act = act;
  moe_act.moe = true;
  const PlanModel moe_view = has_moe ? moe_block_view(model) : model;
  const double moe_per_layer = has_moe ? activation_bytes_per_layer(moe_view, s, b, moe_act) : 0.0;
  const MoeLayerShare moe_params = has_moe ? moe_layer_parameters_per_rank(model, l.tp, l.ep) : MoeLayerShare{};
  const std::vector<std::int64_t> moe_ranks = moe_blocks_per_rank(model.spec, stage_chunks(model, l), l.pp);
  // Vocab-parallel embedding; a learned position table is not split.
  const double embedding = vocab * h / t + d(model.spec.position_rows()) * h;
  // The output layer: its own matrix when untied; when tied, Megatron keeps a copy of the
  // word embeddings on the last stage if it is not also the first.
  const double head = (!model.spec.tied_embeddings || l.pp > 1) ? vocab * h / t : 0.0;
  const double final_norm = (model.spec.norm == NormKind::kLayerNorm ? 2.0 : 1.0) * h;

  MemoryBreakdown worst;
  // The first rank, the last, and the first of the ranks with the most blocks (among equal
  // block counts the earliest holds the most micro-batches in flight).
  const auto heaviest = std::max_element(ranks.begin(), ranks.end()) - ranks.begin();
  std::vector<std::int64_t> stages = {0, l.pp - 1, heaviest};
  // With MoE layers the stages differ in kind as well as in count (DeepSeek-V3's first three
  // blocks are dense): every one is evaluated.
  if (has_moe) {
    stages.clear();
    for (std::int64_t i = 0; i < l.pp; ++i) stages.push_back(i);
  }
  for (std::int64_t stage : stages) {
    const bool first = stage == 0, last = stage == l.pp - 1;
    const double layers_on_stage = d(ranks[static_cast<std::size_t>(stage)]);
    const double moe_layers = d(moe_ranks[static_cast<std::size_t>(stage)]);
    const double dense_layers = layers_on_stage - moe_layers;
    double params = dense_layers * layer_params + moe_layers * moe_params.dense;
    if (first) params += embedding;
    if (last) params += head + final_norm;
    const double expert_params = moe_layers * moe_params.experts;
    // ZeRO shards over the gradient group, dp x cp (cp ranks hold the same parameters); the
    // routed experts' over the expert-data-parallel group, dp x cp / ep.
    const std::int64_t group = l.dp * l.cp;
    const std::int64_t edp = group / std::max<std::int64_t>(l.ep, 1);
    ModelStates states = model_state_bytes(params, l.zero, group, precision);
    const ModelStates expert_states = model_state_bytes(expert_params, l.zero, edp, precision);
    states.params += expert_states.params, states.grads += expert_states.grads;
    states.optimizer += expert_states.optimizer;
    // The unit ZeRO 2/3 holds whole (a block): a MoE one where the stage has any; its experts
    // sharded over edp, the rest over dp x cp.
    const double unit_params = moe_layers > 0 ? moe_params.total() : layer_params;
    const double unit_gathered =
        moe_layers > 0 ? moe_params.dense * d(group - 1) / d(group) + moe_params.experts * d(edp - 1) / d(edp)
                       : layer_params * d(group - 1) / d(group);
    // ZeRO-3 gathers each layer's weights before using it and prefetches zero3_prefetch
    // more: 1 + depth layers of this tp rank live at once, of which the own 1/group block
    // is in the shard already. ZeRO 2 and 3: the backward writes one layer's full-size
    // gradient while the previous layer's reduce-scatter is in flight (FSDP's 2x unit
    // gradients): each is handed back once reduced into the shard. A head tied to the
    // embedding on the same rank writes the token table's gradient first, and it is reduced
    // last (its unit).
    if (l.zero >= 3 && group > 1) states.params += d(1 + l.zero3_prefetch) * unit_gathered * precision.param_bytes;
    if (l.zero >= 2 && group > 1) {
      states.grads += 2 * unit_params * precision.grad_bytes;
      if (first && last && model.spec.tied_embeddings) states.grads += vocab * h / t * precision.grad_bytes;
    }
    double offloaded = 0;
    if (l.offload_optimizer) std::swap(offloaded, states.optimizer);
    // To pinned host memory: the moments, plus the fp32 master copy of the shard where the
    // GPU's parameters are fp32 (their own master there; the host updates its copy).
    const double host = l.offload_optimizer && l.offload_to_host
                            ? offloaded + (precision.param_bytes >= 4
                                               ? 4.0 * (params / d(l.zero >= 1 ? group : 1) +
                                                        expert_params / d(l.zero >= 1 ? edp : 1))
                                               : 0.0)
                            : 0.0;

    const double in_flight = microbatches_in_flight(l.schedule, l.pp, m, l.vpp, stage);
    double activations = (dense_layers * per_layer + moe_layers * moe_per_layer) * in_flight;
    if (l.recompute == Recompute::kFull ||
        (l.recompute == Recompute::kSelective && l.attention == Attention::kFlash)) {
      // During the backward pass one layer is rematerialised: in full (its input, already
      // kept, aside), or under selective with flash attention its attention output and
      // log-sum-exp (what selective drops). The larger of a dense and a MoE layer.
      ActivationOptions none = act;
      none.recompute = Recompute::kNone;
      double again = dense_layers > 0 ? activation_bytes_per_layer(model, s, b, none) - per_layer : 0.0;
      if (moe_layers > 0) {
        ActivationOptions moe_none = moe_act;
        moe_none.recompute = Recompute::kNone;
        again = std::max(again, activation_bytes_per_layer(moe_view, s, b, moe_none) - moe_per_layer);
      }
      activations += again;
    }
    // Korthikanti et al. 2022 section 4.3: the embedding dropout mask, sbhp/t with
    // sequence parallelism (p micro-batches in flight on the first stage) ...
    if (first && model.dropout) activations += s * b * h * in_flight / sp;
    // ... and on the last stage the final norm and output-projection inputs (4sbh/t with
    // sequence parallelism) and the logits of the cross entropy (fp32: 4sbV/t), for the one
    // micro-batch whose loss is being computed, with what ndmesh holds beside them for their
    // gradient (logit_bytes_held).
    if (last)
      activations += precision.activation_bytes * 2 * s * b * h / sp +
                     logit_bytes_held(precision, l.tp) * s * b * vocab / t;

    const double total = states.total() + activations;
    const double mean_per_layer =
        layers_on_stage > 0 ? (dense_layers * per_layer + moe_layers * moe_per_layer) / layers_on_stage : per_layer;
    if (stage == 0 || total > worst.total) {
      worst = MemoryBreakdown{.params = states.params,
                              .grads = states.grads,
                              .optimizer = states.optimizer,
                              .optimizer_offloaded = offloaded,
                              .optimizer_host = host,
                              .activations = activations,
                              .total = total,
                              .stage = stage,
                              .stage_parameters = params + expert_params,
                              .layers_on_stage = layers_on_stage,
                              .in_flight = in_flight,
                              .activation_per_layer = mean_per_layer,
                              .stage_expert_parameters = expert_params,
                              .moe_layers_on_stage = moe_layers};
    }
  }
  return worst;
}

Placement placement(const Layout& l, std::int64_t gpus_per_node) {
  const Mesh mesh({{"dp", l.dp}, {"pp", l.pp}, {"cp", l.cp}, {"tp", l.tp}});
  // A group of one rank is inside a node by definition; only larger groups are asked
  // (each query walks every group, which is what the search pays for on huge worlds).
  auto in_node = [&](const char* dims, std::int64_t size) {
    return size == 1 || mesh.groups_within_node(mesh.dims_of(dims), gpus_per_node);
  };
  Placement p;
  p.tp_in_node = in_node("tp", l.tp);
  p.cp_in_node = in_node("cp", l.cp);
  p.pp_in_node = in_node("pp", l.pp);
  p.dp_in_node = in_node("dp-cp", l.dp * l.cp);
  if (l.ep > 1) {
    // The folded groups, as the mesh cuts them: each dp-cp group's expert groups (blocks of ep
    // members) and expert-data-parallel groups (the same place in every block).
    const DimSet dpcp = mesh.dims_of("dp-cp");
    p.ep_per_node = l.ep;
    mesh.for_each_group(dpcp, [&](std::int64_t, const GroupView& g) {
      for (std::int64_t j = 0; j < g.size(); j += l.ep) {
        const auto members = mesh.fold_group(g[j], dpcp, l.ep, Mesh::Fold::kInner);
        const std::int64_t node = Mesh::placement(members.front(), gpus_per_node).node;
        const auto here = std::count_if(members.begin(), members.end(), [&](std::int64_t r) {
          return Mesh::placement(r, gpus_per_node).node == node;
        });
        p.ep_per_node = std::min<std::int64_t>(p.ep_per_node, here);
        if (here < l.ep) p.ep_in_node = false;
      }
      for (std::int64_t j = 0; j < l.ep && p.edp_in_node; ++j) {
        const auto members = mesh.fold_group(g[j], dpcp, l.ep, Mesh::Fold::kOuter);
        const std::int64_t node = Mesh::placement(members.front(), gpus_per_node).node;
        for (std::int64_t r : members)
          if (Mesh::placement(r, gpus_per_node).node != node) p.edp_in_node = false;
      }
    });
  } else {
    p.edp_in_node = p.dp_in_node;
  }
  return p;
}

TimeBreakdown estimate_time(const PlanModel& model, const Hardware& hw, const Layout& l, const Workload& w,
                            const MemoryBreakdown& memory, const Placement& where,
                            const Precision& precision) {
  const double h = d(model.spec.hidden), vocab = d(model.spec.padded_vocab(l.tp));  // the products' rows
  const double t = d(l.tp), cp = d(l.cp);
  const double s_full = d(w.seq);
  const double s = s_full / cp;
  const double b = d(l.micro_batch);
  const std::int64_t m = microbatches(l, w);
  const double rate = hw.peak_flops * hw.achievable_fraction;
  const double e = precision.activation_bytes;
  const bool flash = l.attention == Attention::kFlash;

  TimeBreakdown r;
  r.tp_bw = where.tp_in_node ? hw.intra_node_bw : hw.inter_node_bw;
  r.cp_bw = where.cp_in_node ? hw.intra_node_bw : hw.inter_node_bw;
  r.pp_bw = where.pp_in_node ? hw.intra_node_bw : hw.inter_node_bw;
  r.dp_bw = where.dp_in_node ? hw.intra_node_bw : hw.inter_node_bw;
  auto latency = [&](bool in_node) { return in_node ? hw.intra_node_latency : hw.inter_node_latency; };

  // One layer, one micro-batch, one GPU: products, attention, memory-bound work, recompute.
  const LayerShape shape{.tokens = b * s,
                         .seq = s_full,
                         .micro_batch = b,
                         .tp = l.tp,
                         .recompute = l.recompute,
                         .attention = l.attention,
                         .activation_bytes = e,
                         .unfused_elementwise = precision.unfused_elementwise,
                         .bf16_products = precision.bf16_products,
                         .sequence_parallel = l.sequence_parallel};
  const double attention_rate = hw.attention_flops * hw.achievable_fraction;  // 0: the products' rate
  const LayerTime layer = layer_time(model, shape, rate, hw.gemm_overhead, hw.memory_bw, attention_rate);
  // A mixture of experts' layer: the active experts' MLP (moe_block_view) with its products
  // per local expert, and the token all-to-alls over the expert group.
  const bool has_moe = model.spec.experts > 0;
  const PlanModel moe_view = has_moe ? moe_block_view(model) : model;
  LayerShape moe_shape = shape;
  moe_shape.ep = std::max<std::int64_t>(l.ep, 1);
  const LayerTime moe_layer =
      has_moe ? layer_time(moe_view, moe_shape, rate, hw.gemm_overhead, hw.memory_bw, attention_rate) : layer;
  double a2a_layer = 0;
  if (has_moe && l.ep > 1) {
    // Dispatch and combine forward, their gradients backward (a full recompute dispatches and
    // combines once more): each rank sends its rows' top_k copies (split over tp with sequence
    // parallelism), the part for its own experts staying.
    r.ep_bytes = b * s * d(model.spec.top_k) * h * e / (l.sequence_parallel ? t : 1.0);
    r.ep_bw = where.ep_in_node ? hw.intra_node_bw : hw.inter_node_bw;
    a2a_layer = (l.recompute == Recompute::kFull ? 6.0 : 4.0) *
                all_to_all_seconds(r.ep_bytes, l.ep, where.ep_per_node, hw.intra_node_bw, hw.inter_node_bw,
                                   latency(where.ep_in_node));
  }
  r.tokens_per_gpu = b * s;
  r.elementwise_bytes_per_token = elementwise_bytes_per_token(model, shape);
  r.gemm_efficiency = layer.gemm > 0 ? layer.gemm_ideal / (layer.gemm - 0.0) : 1.0;
  // Tensor parallelism: 4 all-reduces of b (s/cp) h activations per layer and micro-batch (2
  // forward, 2 backward; 6 with full recompute), as ring all-reduces (with sequence
  // parallelism an all-gather and a reduce-scatter, the same steps and bytes).
  // Under bf16 with sequence parallelism the two forward all-gathers (of the norms' outputs)
  // move bf16: half of each of those all-reduces moves half the bytes.
  double tp_layer = l.tp > 1 ? (l.recompute == Recompute::kFull ? 6.0 : 4.0) *
                                   allreduce_seconds(b * s * h * e, l.tp, r.tp_bw, latency(where.tp_in_node))
                             : 0.0;
  if (l.tp > 1 && l.sequence_parallel && precision.norm_output_bytes > 0) {
    const double forwards = l.recompute == Recompute::kFull ? 2.0 : 1.0;
    tp_layer -= forwards * 2 * 0.5 *
                (allreduce_seconds(b * s * h * e, l.tp, r.tp_bw, latency(where.tp_in_node)) -
                 allreduce_seconds(b * s * h * precision.norm_output_bytes, l.tp, r.tp_bw, latency(where.tp_in_node)));
  }
  // Context parallelism: the ring of K/V blocks against one block pair's attention.
  RingTime ring;
  if (l.cp > 1) {
    const double kv_rank = std::max(d(model.spec.kv_heads_or_heads()) / t, 1.0) * h / d(model.spec.heads);
    const double step = (flash ? 0.5 : 1.0) * 4 * b * s * s * h / t / (attention_rate > 0 ? attention_rate : rate);
    // ndmesh's bf16 moves the blocks as stored (Precision::attention_input_bytes), the dK/dV
    // sums at activation_bytes.
    const double kv_e = precision.attention_input_bytes > 0 ? precision.attention_input_bytes : e;
    ring = ring_attention_time(2 * b * s * kv_rank * kv_e, l.cp, step, r.cp_bw, latency(where.cp_in_node),
                               flash ? 2.5 : 2.0, 2 * b * s * kv_rank * e);
  }
  const double per_layer = layer.total() + tp_layer + ring.exposed;
  const double per_moe_layer = moe_layer.total() + tp_layer + ring.exposed + a2a_layer;
  const std::vector<std::int64_t> moe_ranks = moe_blocks_per_rank(model.spec, stage_chunks(model, l), l.pp);

  // The end stages: the last runs the output layer (b s x V/t x h products, 3 kernels) and
  // the loss over the vocabulary; the first the embedding lookup and its gradient ((3e + 8)
  // bytes per element of b s h: read and write forward, fp32 accumulate backward).
  const double head = 3 * kernel_seconds(2 * b * s * (vocab / t) * h, rate, hw.gemm_overhead);
  const double loss = loss_memory_seconds(b * s, vocab, l.tp, hw.memory_bw, loss_bytes_per_logit(precision, l.tp));
  const double embed = hw.memory_bw > 0 ? (3 * e + 8) * b * s * h / hw.memory_bw : 0.0;

  // The slowest rank sets the pace of the pipeline.
  const std::vector<std::int64_t> ranks = blocks_per_rank(stage_chunks(model, l), l.pp);
  double slowest = -1;
  std::size_t at = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const double extra = (i + 1 == ranks.size() ? head + loss : 0.0) + (i == 0 ? embed : 0.0);
    const double time = d(ranks[i] - moe_ranks[i]) * per_layer + d(moe_ranks[i]) * per_moe_layer + extra;
    if (time > slowest) slowest = time, at = i;
  }
  const double layers = d(ranks[at]);
  const double moe_layers = d(moe_ranks[at]), dense_layers = layers - moe_layers;
  const bool last = at + 1 == ranks.size(), first = at == 0;
  r.layers_on_stage = layers;
  r.compute = d(m) * (dense_layers * (layer.gemm + layer.attention) +
                      moe_layers * (moe_layer.gemm + moe_layer.attention) + (last ? head : 0.0));
  r.recompute = d(m) * (dense_layers * layer.recompute + moe_layers * moe_layer.recompute);
  r.memory = d(m) * (dense_layers * layer.memory + moe_layers * moe_layer.memory + (last ? loss : 0.0) +
                     (first ? embed : 0.0));
  r.ep_comm = d(m) * moe_layers * a2a_layer;
  r.end_stage_extra = d(m) * ((last ? head + loss : 0.0) + (first ? embed : 0.0));
  r.tp_comm = d(m) * layers * tp_layer;
  r.cp_comm = d(m) * layers * ring.transfer;
  r.cp_exposed = d(m) * layers * ring.exposed;
  r.ring_exposed_fraction = ring.transfer > 0 ? ring.exposed / ring.transfer : 0.0;
  if (l.pp > 1) {
    // One activation send forward and one gradient send backward per micro-batch and
    // virtual stage (split by tp with sequence parallelism), each latency + bytes / bw.
    const double bytes = b * s * h * e / (l.sequence_parallel ? t : 1.0);
    r.pp_comm = d(m) * 2 * d(l.vpp) * (latency(where.pp_in_node) + bytes / r.pp_bw);
  }
  r.bubble_fraction = bubble_fraction(l.schedule, l.pp, m, l.vpp);
  const double work = r.compute + r.recompute + r.memory + r.tp_comm + r.cp_exposed + r.pp_comm + r.ep_comm;
  r.bubble = work * r.bubble_fraction;

  const double dpc = d(l.dp * l.cp);
  const double edp = dpc / d(std::max<std::int64_t>(l.ep, 1));
  r.edp_bw = where.edp_in_node ? hw.intra_node_bw : hw.inter_node_bw;
  if (dpc > 1) {
    // The routed experts' gradients are reduced over their expert-data-parallel group (dp x cp
    // / ep, none when ep = dp x cp), the rest over dp x cp: the two rings one after the other.
    const double grad_bytes = precision.grad_bytes * (memory.stage_parameters - memory.stage_expert_parameters);
    const double expert_ring = edp > 1 ? (edp - 1) / edp * precision.grad_bytes * memory.stage_expert_parameters / r.edp_bw
                                       : 0.0;
    const double ring_bytes = (dpc - 1) / dpc * grad_bytes / r.dp_bw + expert_ring;
    const double backward = r.compute * 2.0 / 3.0 + r.recompute;
    switch (l.zero) {
      case 0:
      case 1:  // all-reduce (or reduce-scatter + all-gather) once per step
        r.dp_comm = 2 * ring_bytes;
        r.dp_overlap = backward / d(m);
        break;
      case 2:  // reduce-scatter per micro-batch, all-gather of the updated shard once
        r.dp_comm = (d(m) + 1) * ring_bytes;
        r.dp_overlap = backward;
        break;
      default:  // ZeRO-3: gather weights forward and backward, reduce-scatter gradients
        r.dp_comm = 3 * d(m) * ring_bytes;
        r.dp_overlap = r.compute + r.recompute;
        break;
    }
    r.dp_expert_comm = ring_bytes > 0 ? r.dp_comm * expert_ring / ring_bytes : 0.0;
    if (!l.dp_overlap) r.dp_overlap = 0;
    r.dp_exposed = std::max(0.0, r.dp_comm - r.dp_overlap);
  }
  if (l.offload_optimizer && l.offload_to_host && memory.optimizer_offloaded > 0) {
    // Each GPU over its own host link: the shard's gradients to the host, its updated
    // parameters back (ndmesh copies them in fp32), one after the other on one copy stream.
    const double shard = memory.optimizer_offloaded / precision.optimizer_bytes;
    r.offload_bytes = shard * (precision.grad_bytes + precision.param_bytes);
    r.offload = hw.device_to_host_bw > 0 && hw.host_to_device_bw > 0
                    ? shard * (precision.grad_bytes / hw.device_to_host_bw + precision.param_bytes / hw.host_to_device_bw)
                    : 0.0;
  } else if (l.offload_optimizer && memory.optimizer_offloaded > 0) {
    // The node's GPUs share its disk: each reads and writes its optimizer state once.
    const double per_node = d(std::min(l.gpus(), hw.gpus_per_node));
    r.offload_bytes = memory.optimizer_offloaded;
    r.offload = hw.disk_read_bw > 0 && hw.disk_write_bw > 0
                    ? per_node * r.offload_bytes * (1 / hw.disk_read_bw + 1 / hw.disk_write_bw)
                    : 0.0;
  }
  // ndmesh's optimizer step over the shard in device memory, once a step (not in the bubble).
  const double step_update = precision.unfused_elementwise && hw.memory_bw > 0 && precision.optimizer_bytes > 0
                                 ? (kOptimizerStepBytes + (l.zero >= 3 ? 0.0 : precision.weight_copy_bytes)) *
                                       memory.optimizer / precision.optimizer_bytes / hw.memory_bw
                                 : 0.0;
  r.memory += step_update;
  r.total = work + step_update + r.bubble + r.dp_exposed + r.offload;
  return r;
}

Estimate estimate(const PlanModel& model, const Hardware& hw, const Layout& layout, const Workload& workload,
                  const Precision& precision) {
  Estimate e;
  e.layout = layout;
  e.microbatches = microbatches(layout, workload);
  e.memory = estimate_memory(model, layout, workload, precision);
  e.where = placement(layout, hw.gpus_per_node);
  e.time = estimate_time(model, hw, layout, workload, e.memory, e.where, precision);
  const ParameterCount count = count_parameters(model);
  e.parameters = count.total();
  e.active_parameters = count.active();
  e.model_flops = model_flops_per_step(model, d(workload.seq), d(workload.global_batch));
  e.tokens_per_second = d(workload.global_batch) * d(workload.seq) / e.time.total;
  e.mfu = e.model_flops / (e.time.total * d(layout.gpus()) * hw.peak_flops);
  e.capacity_bytes = hw.usable_bytes();
  e.fits = e.memory.total <= e.capacity_bytes;
  return e;
}

}  // namespace ndmesh::plan
