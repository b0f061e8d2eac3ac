// The Python module `ndmesh`: the library's layout, planning and schedule answers for
// Python and PyTorch users, with the same numbers and the same one-line error messages as
// the C++ library and the `ndmesh` command.
//
// Everything here is a thin translation: train() is train::run with the options bound by
// `ndmesh train`'s own flag code (tools/ndmesh/train.cpp), the Mesh is ndmesh::Mesh, a layout is built and
// validated by config's layout_dims/resolve/validate (as `ndmesh mesh` does), the planner
// is plan::search/plan::estimate and schedules are pp::make_schedule/simulate/svg_timeline.
// Results cross into Python as plain ints, lists and dicts. C++ exceptions become
// ndmesh.ConfigError (a ValueError), ndmesh.IoError (an OSError), ndmesh.InternalError (a bug:
// a broken invariant) or ndmesh.Error (a RuntimeError, base of all four), with what() as message.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/config/partition.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/mesh/mesh.hpp"
#include "ndmesh/parallel/pp/check.hpp"
#include "ndmesh/parallel/pp/render.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/plan/report.hpp"
#include "ndmesh/plan/search.hpp"
#include "ndmesh/train/run.hpp"
#include "subcommand.hpp"
#include "train.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace ndmesh::python {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// ------------------------------------------------------------------------- exceptions

// The Python exception classes, created once at import; never freed (they live as long
// as the interpreter, and a static py::object would be destroyed after it).
struct Exceptions {
  PyObject* error = nullptr;
  PyObject* config = nullptr;
  PyObject* io = nullptr;
  PyObject* internal = nullptr;
};
Exceptions& exceptions() {
  static Exceptions e;
  return e;
}

py::object make_exception(py::module_& m, const char* name, py::tuple bases, const char* doc) {
  py::dict ns;
  ns["__doc__"] = doc;
  ns["__module__"] = "ndmesh";
  py::object cls =
      py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyType_Type))(name, bases, ns);
  m.attr(name) = cls;
  return cls;
}

void raise(PyObject* type, const Error& e) {
  py::object value = py::reinterpret_borrow<py::object>(type)(e.what());
  value.attr("component") = e.component();
  PyErr_SetObject(type, value.ptr());
}

void register_exceptions(py::module_& m) {
  py::object error = make_exception(m, "Error", py::make_tuple(py::handle(PyExc_RuntimeError)),
                                    "Base of every ndmesh error (a RuntimeError). str(e) is the one-line "
                                    "message '[component] what, the value and the fix'; e.component names "
                                    "the component.");
  py::object config =
      make_exception(m, "ConfigError", py::make_tuple(error, py::handle(PyExc_ValueError)),
                     "Bad input: a layout, a size, a model or an option (also a ValueError).");
  py::object io = make_exception(m, "IoError", py::make_tuple(error, py::handle(PyExc_OSError)),
                                 "A file that cannot be read or written (also an OSError).");
  py::object internal =
      make_exception(m, "InternalError", py::make_tuple(error),
                     "A broken invariant: a bug in ndmesh or in the code calling it, never bad input.");
  auto& ex = exceptions();
  ex.error = error.release().ptr();
  ex.config = config.release().ptr();
  ex.io = io.release().ptr();
  ex.internal = internal.release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    const auto& types = exceptions();
    try {
      std::rethrow_exception(p);
    } catch (const ConfigError& e) {
      raise(types.config, e);
    } catch (const IoError& e) {
      raise(types.io, e);
    } catch (const InternalError& e) {
      raise(types.internal, e);
    } catch (const Error& e) {
      raise(types.error, e);
    }
  });
}

// ------------------------------------------------------------------------------- mesh

// Dim names given as "dp-cp", "dp,cp" or a list of names -> the DimSet of the mesh.
DimSet to_dims(const Mesh& mesh, const py::handle& dims) {
  if (py::isinstance<py::str>(dims)) return mesh.dims_of(dims.cast<std::string>());
  std::vector<std::string> names = dims.cast<std::vector<std::string>>();
  return mesh.dims_of(fmt::format("{}", fmt::join(names, ",")));
}

// One dim given by name or index.
int to_dim(const Mesh& mesh, const py::handle& dim) {
  if (py::isinstance<py::str>(dim)) return mesh.index(dim.cast<std::string>());
  const auto i = dim.cast<std::int64_t>();
  NDMESH_CHECK_CONFIG(i >= 0 && i < mesh.ndims(), "mesh",
                      "dim index {} is out of range; the mesh {} has {} dims", i, mesh.to_string(),
                      mesh.ndims());
  return static_cast<int>(i);
}

Edge to_edge(const std::string& edge) {
  if (edge == "ring") return Edge::kRing;
  if (edge == "line") return Edge::kLine;
  fail<ConfigError>("mesh", "edge '{}' is unknown; use 'ring' (wraps) or 'line' (none past the ends)", edge);
}

// The "name=size,..." text of dims given as a list of (name, size) pairs or a dict.
std::string dims_text(const py::handle& spec) {
  std::vector<std::string> parts;
  if (py::isinstance<py::dict>(spec)) {
    for (auto [k, v] : spec.cast<py::dict>())
      parts.push_back(fmt::format("{}={}", k.cast<std::string>(), v.cast<std::int64_t>()));
  } else {
    for (auto item : spec) {
      auto pair = item.cast<std::pair<std::string, std::int64_t>>();
      parts.push_back(fmt::format("{}={}", pair.first, pair.second));
    }
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

// Mesh(spec=None, *, order=, megatron_order=, world=, dp=, pp=, cp=, tp=, ep=): the same
// resolution and validation as the layout flags of `ndmesh mesh`.
Mesh make_mesh(const py::object& spec, const py::kwargs& kwargs) {
  LayoutSpec layout;
  std::int64_t world = 0;
  bool have_world = false;
  for (auto [k, v] : kwargs) {
    const auto key = k.cast<std::string>();
    if (key == "order") {
      layout.order = v.cast<std::string>();
    } else if (key == "megatron_order") {
      layout.megatron_order = v.cast<std::string>();
    } else if (key == "dims") {
      layout.dims = v.cast<std::string>();
    } else if (key == "world") {
      world = v.cast<std::int64_t>();
      have_world = true;
    } else if (key == "dp" || key == "pp" || key == "cp" || key == "tp" || key == "ep") {
      layout.sizes[key] = v.cast<std::int64_t>();
    } else {
      throw py::type_error(fmt::format(
          "Mesh() got an unexpected keyword argument '{}'; use dp, pp, cp, tp, ep, order, megatron_order, "
          "dims or world",
          key));
    }
  }
  if (!spec.is_none()) {
    if (!layout.dims.empty())
      throw py::type_error("Mesh() got the dims twice (positional and dims=); give them once");
    layout.dims = py::isinstance<py::str>(spec) ? spec.cast<std::string>() : dims_text(spec);
  }
  ParallelConfig config;
  config.dims = layout_dims(layout);
  if (have_world) {
    NDMESH_CHECK_CONFIG(world >= 1, "config", "--world {} must be at least 1", world);
    config.world = world;
  }
  config = resolve(config);
  validate(config);
  return config.mesh();
}

py::dict coords_dict(const Mesh& m, std::int64_t rank) {
  const Coords c = m.coords(rank);
  py::dict out;
  for (int i = 0; i < m.ndims(); ++i) out[py::str(m.dim(i).name)] = c[i];
  return out;
}

py::object opt(std::optional<std::int64_t> v) {
  return v ? py::object(py::int_(*v)) : py::object(py::none());
}

std::vector<DimSet> kinds_of(const Mesh& m, const py::object& groups) {
  std::vector<DimSet> kinds;
  if (groups.is_none()) {
    for (int i = 0; i < m.ndims(); ++i) kinds.push_back(DimSet::single(i));
    return kinds;
  }
  std::vector<py::object> items;
  if (py::isinstance<py::str>(groups)) {
    for (auto part : py::str(groups).attr("split")(","))
      items.push_back(py::reinterpret_borrow<py::object>(part));
  } else {
    for (auto item : groups) items.push_back(py::reinterpret_borrow<py::object>(item));
  }
  for (const auto& item : items) {
    DimSet s = to_dims(m, item);
    if (std::find(kinds.begin(), kinds.end(), s) == kinds.end()) kinds.push_back(s);
  }
  return kinds;
}

py::list group_list(const GroupView& g) {
  py::list out;
  g.for_each([&](std::int64_t r) { out.append(r); });
  return out;
}

// `ndmesh mesh --json`: world_size, dims, groups of each kind and (with ranks_per_node)
// the placement of each kind.
py::dict mesh_dict(const Mesh& m, const py::object& groups, std::int64_t ranks_per_node) {
  py::dict out;
  out["world_size"] = m.world_size();
  py::list dims;
  for (const auto& d : m.dims()) dims.append(py::dict("name"_a = d.name, "size"_a = d.size));
  out["dims"] = dims;
  py::dict gs;
  const auto kinds = kinds_of(m, groups);
  for (DimSet k : kinds) {
    py::list list;
    m.for_each_group(k, [&](std::int64_t, const GroupView& g) { list.append(group_list(g)); });
    gs[py::str(m.key_name(k))] = list;
  }
  out["groups"] = gs;
  if (ranks_per_node > 0) {
    out["ranks_per_node"] = ranks_per_node;
    py::dict placement;
    for (DimSet k : kinds) {
      const auto p = m.group_placement(k, ranks_per_node);
      placement[py::str(m.key_name(k))] =
          py::dict("groups"_a = p.groups, "groups_crossing_nodes"_a = p.groups_crossing,
                   "max_nodes_spanned"_a = p.max_nodes_spanned);
    }
    out["placement"] = placement;
  }
  return out;
}

// `ndmesh mesh --rank R --json`: one rank's coords, node, groups and neighbours.
py::dict rank_dict(const Mesh& m, std::int64_t rank, const py::object& groups, std::int64_t ranks_per_node) {
  py::dict out;
  out["rank"] = rank;
  out["coords"] = coords_dict(m, rank);
  if (ranks_per_node > 0) {
    const auto p = Mesh::placement(rank, ranks_per_node);
    out["node"] = p.node;
    out["local_rank"] = p.local_rank;
  } else {
    out["node"] = py::none();
    out["local_rank"] = py::none();
  }
  py::dict gs;
  for (DimSet k : kinds_of(m, groups)) gs[py::str(m.key_name(k))] = group_list(m.group(rank, k));
  out["groups"] = gs;
  py::dict nb;
  for (int i = 0; i < m.ndims(); ++i) {
    nb[py::str(m.dim(i).name)] = py::dict("prev"_a = opt(m.neighbour(rank, i, -1, Edge::kLine)),
                                          "next"_a = opt(m.neighbour(rank, i, +1, Edge::kLine)),
                                          "ring_prev"_a = *m.neighbour(rank, i, -1, Edge::kRing),
                                          "ring_next"_a = *m.neighbour(rank, i, +1, Edge::kRing),
                                          "first"_a = m.first(rank, i), "last"_a = m.last(rank, i));
  }
  out["neighbours"] = nb;
  return out;
}

// ------------------------------------------------------------------------- validation

// A dict of the architecture description's keys (config.hpp: model_keys) as a ModelSpec.
std::vector<std::pair<std::string, ModelValue>> model_entries(const py::dict& d) {
  std::vector<std::pair<std::string, ModelValue>> out;
  for (auto [k, v] : d) {
    const auto key = k.cast<std::string>();
    if (py::isinstance<py::bool_>(v))
      out.emplace_back(key, v.cast<bool>());
    else if (py::isinstance<py::int_>(v))
      out.emplace_back(key, v.cast<std::int64_t>());
    else if (py::isinstance<py::float_>(v))
      out.emplace_back(key, v.cast<double>());
    else if (py::isinstance<py::str>(v))
      out.emplace_back(key, v.cast<std::string>());
    else
      fail<ConfigError>("config", "model['{}'] must be a number, a bool or a name", key);
  }
  return out;
}

ModelSpec to_model(const py::dict& d) {
  ModelSpec m;
  set_model_keys(m, model_entries(d), "model");
  return m;
}

ParallelConfig to_config(const Mesh& mesh, const std::string& schedule, std::int64_t vpp,
                         bool sequence_parallel, std::int64_t micro_batch, std::int64_t global_batch,
                         std::int64_t ranks_per_node) {
  ParallelConfig c;
  c.dims = mesh.dims();
  c.world = mesh.world_size();
  c.schedule = parse_schedule(schedule);
  c.vpp = vpp;
  c.sequence_parallel = sequence_parallel;
  c.micro_batch = micro_batch;
  c.global_batch = global_batch;
  c.ranks_per_node = ranks_per_node;
  return c;
}

// ----------------------------------------------------------------------------- planner

// A model: a preset name, or a dict of ModelSpec fields (with "mlp": "gelu" | "swiglu"
// and optionally "preset" to start from), as `ndmesh plan --model/--layers/...` takes.
plan::PlanModel to_plan_model(const py::object& model, std::int64_t seq, bool no_dropout) {
  plan::PlanModel m;
  if (py::isinstance<py::str>(model)) {
    m = plan::model_preset(model.cast<std::string>());
  } else if (py::isinstance<py::dict>(model)) {
    py::dict d = model.cast<py::dict>();
    py::dict fields;
    if (d.contains("preset")) m = plan::model_preset(d["preset"].cast<std::string>());
    for (auto [k, v] : d)
      if (k.cast<std::string>() != "preset") fields[k] = v;
    // Without "arch", "mlp" picks the family as `ndmesh plan --mlp` does: a SwiGLU model is
    // Llama-shaped, a GeLU one GPT-shaped.
    if (fields.contains("mlp") && !fields.contains("arch")) {
      const bool llama = parse_mlp_kind(fields["mlp"].cast<std::string>(), "model['mlp']") == MlpKind::kSwiglu;
      const bool tied = m.spec.tied_embeddings;
      m.spec = with_arch(m.spec, llama ? "llama" : "gpt2");
      m.spec.tied_embeddings = llama && !d.contains("preset") ? false : tied;
      m.dropout = !llama;
    } else if (fields.contains("arch") && !d.contains("preset")) {
      m.dropout = fields["arch"].cast<std::string>() == "gpt2";
    }
    set_model_keys(m.spec, model_entries(fields), "model");
  } else {
    fail<ConfigError>("plan",
                      "model must be a preset name ({}) or a dict with layers, hidden, heads and vocab",
                      plan::model_preset_names());
  }
  if (no_dropout) m.dropout = false;
  if (m.spec.name.empty()) m.spec.name = "custom";
  if (seq != 0) m.spec.seq = seq;
  NDMESH_CHECK_CONFIG(m.spec.seq >= 1, "plan", "--seq {} must be at least 1, e.g. --seq 4096", m.spec.seq);
  const auto probs = plan::plan_model_problems(m);
  NDMESH_CHECK_CONFIG(probs.empty(), "plan", "bad model: {}", fmt::join(probs, "; "));
  return m;
}

plan::Precision to_precision(const std::string& precision) { return plan::parse_precision(precision); }

// A hardware preset name, or a dict {"preset": name, "gpu_memory_gib": .., "reserved_gib":
// .., "peak_tflops": .., "efficiency": .., "intra_node_gbps": .., "inter_node_gbps": ..,
// "gpus_per_node": .., "memory_gbps": .., "intra_node_latency_us": .., "inter_node_latency_us": ..,
// "gemm_overhead_us": ..} of overrides, as the --hardware flags of `ndmesh plan`.
plan::Hardware to_hardware(const py::object& hardware) {
  plan::Hardware hw;
  if (py::isinstance<py::str>(hardware)) {
    hw = plan::hardware_preset(hardware.cast<std::string>());
  } else {
    py::dict d = hardware.cast<py::dict>();
    hw = plan::hardware_preset(d.contains("preset") ? d["preset"].cast<std::string>() : std::string("h100"));
    for (auto [k, v] : d) {
      const auto key = k.cast<std::string>();
      if (key == "preset") continue;
      if (key == "gpus_per_node") {
        hw.gpus_per_node = v.cast<std::int64_t>();
        continue;
      }
      const double x = v.cast<double>();
      if (key == "gpu_memory_gib")
        hw.memory_bytes = x * kGiB;
      else if (key == "reserved_gib")
        hw.reserved_bytes = x * kGiB;
      else if (key == "peak_tflops")
        hw.peak_flops = x * 1e12;
      else if (key == "efficiency")
        hw.achievable_fraction = x;
      else if (key == "intra_node_gbps")
        hw.intra_node_bw = x * 1e9;
      else if (key == "inter_node_gbps")
        hw.inter_node_bw = x * 1e9;
      else if (key == "memory_gbps")
        hw.memory_bw = x * 1e9;
      else if (key == "intra_node_latency_us")
        hw.intra_node_latency = x * 1e-6;
      else if (key == "inter_node_latency_us")
        hw.inter_node_latency = x * 1e-6;
      else if (key == "gemm_overhead_us")
        hw.gemm_overhead = x * 1e-6;
      else
        fail<ConfigError>(
            "plan",
            "hardware key '{}' is unknown; use preset, gpu_memory_gib, reserved_gib, peak_tflops, "
            "efficiency, intra_node_gbps, inter_node_gbps, gpus_per_node, memory_gbps, "
            "intra_node_latency_us, "
            "inter_node_latency_us, gemm_overhead_us",
            key);
    }
  }
  const auto probs = plan::hardware_problems(hw);
  NDMESH_CHECK_CONFIG(probs.empty(), "plan", "bad hardware: {}", fmt::join(probs, "; "));
  return hw;
}

// JSON text from the plan layer (the same function `ndmesh plan --json` prints) as a dict.
py::dict from_json(const std::string& text) { return py::module_::import("json").attr("loads")(text); }

py::dict plan_search(const py::object& model, std::int64_t gpus, std::int64_t global_batch,
                     const py::object& hardware, std::int64_t seq, const std::string& precision,
                     std::size_t top, bool no_dropout, const std::string& attention) {
  NDMESH_CHECK_CONFIG(gpus >= 1, "plan",
                      "--gpus {} is missing or below 1; give the number of GPUs, e.g. --gpus 512", gpus);
  NDMESH_CHECK_CONFIG(
      global_batch >= 1, "plan",
      "--global-batch {} is missing or below 1; give sequences per step, e.g. --global-batch 1024",
      global_batch);
  NDMESH_CHECK_CONFIG(top >= 1, "plan", "--top {} must be at least 1, e.g. --top 10", top);
  const plan::PlanModel m = to_plan_model(model, seq, no_dropout);
  const plan::Hardware hw = to_hardware(hardware);
  const plan::Workload w{.seq = m.spec.seq, .global_batch = global_batch};
  const plan::SearchOptions options{.gpus = gpus,
                                    .workload = w,
                                    .top = top,
                                    .precision = to_precision(precision),
                                    .attention = plan::parse_attention(attention, "attention")};
  plan::SearchResult result;
  {
    py::gil_scoped_release release;  // a big search takes a while; let other Python threads run
    result = plan::search(m, hw, options);
  }
  return from_json(plan::search_json(m, hw, options, result, -1));
}

py::dict plan_memory(const py::object& model, std::int64_t tp, std::int64_t cp, std::int64_t pp,
                     std::int64_t dp, std::int64_t vpp, std::int64_t micro_batch, const std::string& schedule,
                     const std::string& recompute, bool sequence_parallel, int zero,
                     std::int64_t global_batch, const py::object& hardware, std::int64_t seq,
                     const std::string& precision, bool no_dropout, const std::string& attention,
                     const std::string& pp_layers) {
  plan::Layout l{.tp = tp, .cp = cp, .pp = pp, .dp = dp, .vpp = vpp, .micro_batch = micro_batch};
  l.schedule = parse_schedule(schedule);
  l.recompute = plan::parse_recompute(recompute);
  l.sequence_parallel = sequence_parallel;
  l.zero = zero;
  l.attention = plan::parse_attention(attention, "attention");
  NDMESH_CHECK_CONFIG(l.zero >= 0 && l.zero <= 3, "plan", "--zero {} is not a ZeRO stage; use 0, 1, 2 or 3",
                      l.zero);
  const plan::PlanModel m = to_plan_model(model, seq, no_dropout);
  const plan::Hardware hw = to_hardware(hardware);
  const std::int64_t gb =
      global_batch != 0 ? global_batch : l.micro_batch * l.dp * std::max<std::int64_t>(l.pp, 1);
  const plan::Workload w{.seq = m.spec.seq, .global_batch = gb};
  const auto probs = problems(plan::parallel_config(l, w, hw.gpus_per_node), &m.spec);
  NDMESH_CHECK_CONFIG(probs.empty(), "plan", "invalid layout: {}", fmt::join(probs, "; "));
  l.stage_layers = pp_layers.empty() ? plan::stage_chunks(m, l)
                                     : parse_partition(pp_layers, m.spec.layers, l.pp, l.vpp, "pp_layers");
  const plan::Estimate e = plan::estimate(m, hw, l, w, to_precision(precision));
  return from_json(plan::memory_json(m, hw, w, e, -1));
}

// --------------------------------------------------------------------------- schedules

py::dict action_dict(const pp::Action& a) {
  py::dict d("kind"_a = std::string(pp::action_kind_name(a.kind)), "microbatch"_a = a.microbatch,
             "chunk"_a = a.chunk);
  if (a.peer >= 0) d["peer"] = a.peer;
  return d;
}

pp::Costs to_costs(double forward, double backward_input, double backward_weight, double p2p) {
  return {
      .forward = forward, .backward_input = backward_input, .backward_weight = backward_weight, .p2p = p2p};
}

// ------------------------------------------------------------------------------ train

// The flags of `ndmesh train` for keyword arguments: name=value as --name=value (underscores
// as dashes), True for a flag given alone, False and None left out, a list joined by commas.
std::vector<std::string> train_args(CLI::App& app, const py::dict& options) {
  std::vector<std::string> args;
  for (auto [key, value] : options) {
    const std::string name = key.cast<std::string>();
    std::string flag = "--" + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const CLI::Option* opt = name.find('-') == std::string::npos ? app.get_option_no_throw(flag) : nullptr;
    if (opt == nullptr || name == "help")
      fail<ConfigError>("train",
                        "ndmesh.train() has no option '{}'; its options are the flags of `ndmesh train --help` with "
                        "underscores, e.g. steps=100, eval_every=50",
                        name);
    if (value.is_none()) continue;
    if (opt->get_expected_max() == 0) {  // a flag: True or False
      if (!py::isinstance<py::bool_>(value))
        fail<ConfigError>("train", "{}={} is not True or False ({} is a flag)", name,
                          py::repr(value).cast<std::string>(), flag);
      if (value.cast<bool>()) args.push_back(flag);
      continue;
    }
    std::string text;
    if (py::isinstance<py::bool_>(value)) {
      text = value.cast<bool>() ? "true" : "false";
    } else if (py::isinstance<py::str>(value)) {
      text = value.cast<std::string>();
    } else if (py::isinstance<py::float_>(value)) {
      text = py::repr(value).cast<std::string>();  // the shortest text that reads back as the same double
    } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
      std::vector<std::string> parts;
      for (auto item : value) parts.push_back(py::str(item).cast<std::string>());
      text = fmt::format("{}", fmt::join(parts, ","));
    } else {
      text = py::str(value).cast<std::string>();
    }
    args.push_back(flag + "=" + text);
  }
  return args;
}

// Ctrl-C in the calling thread ends a one-rank run between steps (KeyboardInterrupt).
class PythonSignals : public train::RunObserver {
 public:
  void on_step(const train::StepRecord&) override {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
};

// ndmesh.train(**options): the report of train::run as JSON text.
std::string train_json(const py::dict& options) {
  auto flags = std::make_shared<cli::TrainFlags>();
  CLI::App app{"Train the GPT model (ndmesh train)"};
  app.name("ndmesh train");
  cli::add_train_flags(app, flags);
  std::vector<std::string> args = train_args(app, options);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ConversionError& e) {
    fail<ConfigError>("train", "{}", cli::conversion_message(app, e));
  } catch (const CLI::ParseError& e) {
    fail<ConfigError>("train", "{}", e.what());
  }
  env::check_all();
  train::RunOptions run_options = cli::parsed_train_options(flags);
  PythonSignals signals;
  py::gil_scoped_release release;
  return train::run(std::move(run_options), {&signals}).json;
}

// -------------------------------------------------------------------------------- module

void bind(py::module_& m) {
  m.doc() =
      "ndmesh: N-dimensional parallel training layouts for Python.\n\n"
      "Mesh lays ranks out on named dims (dp, pp, cp, tp, ep or any names) and answers every\n"
      "layout question: coordinates, the members of any group of any dims, split colors and\n"
      "keys, neighbours, node placement. plan() searches layouts of a model on N GPUs;\n"
      "make_schedule()/simulate()/svg_timeline() generate, time and draw pipeline schedules.\n"
      "Errors: ConfigError (ValueError), IoError (OSError), Error (RuntimeError), with the\n"
      "same one-line messages as the ndmesh command.";
  m.attr("__version__") = NDMESH_VERSION;
  register_exceptions(m);

  py::class_<Mesh>(
      m, "Mesh",
      "The named rank layout: dims outer to inner, the innermost varying fastest (row-major).\n\n"
      "Mesh(tp=2, pp=2, dp=2)                      standard dims, default order dp,pp,cp,tp\n"
      "Mesh(tp=2, dp=2, order='tp,dp,pp,cp')       outer to inner\n"
      "Mesh(tp=2, dp=2, megatron_order='tp-dp')    fastest first (Megatron)\n"
      "Mesh('pipe=2,tensor=2,data=4')              any names, outer to inner\n"
      "Mesh([('pipe', 2), ('data', 4)])            the same as pairs (or a dict)\n"
      "Mesh(tp=8, dp=-1, world=64)                 one size inferred from the world\n\n"
      "Bad layouts raise ConfigError with the message `ndmesh mesh` prints.\n\n>>> ndmesh.Mesh(tp=2, pp=2, "
      "dp=2)\nndmesh.Mesh('dp=2,pp=2,cp=1,tp=2')\n>>> ndmesh.Mesh('pipe=2,data=4').names\n['pipe', "
      "'data']\n>>> ndmesh.Mesh(tp=8, dp=-1, world=64).dims\n[('dp', 8), ('pp', 1), ('cp', 1), ('tp', 8)]")
      .def(py::init([](const py::object& spec, const py::kwargs& kwargs) { return make_mesh(spec, kwargs); }),
           "spec"_a = py::none())
      .def_static(
          "from_config",
          [](const std::string& path) {
            ConfigFile file = load_config_file(path);
            ParallelConfig config = file.parallel;
            config.dims = layout_dims(file.layout);
            config = resolve(config);
            validate(config, file.model ? &*file.model : nullptr);
            return config.mesh();
          },
          "path"_a,
          "The mesh of a TOML config file's [parallel] section, validated with its [model] and [training] "
          "sections (as `ndmesh mesh --config`). IoError when unreadable, ConfigError when invalid.\n\n>>> "
          "ndmesh.Mesh.from_config('missing.toml')\nTraceback (most recent call last):\n    "
          "...\nndmesh.ConfigError: [config] config file 'missing.toml' does not exist; check the path")
      .def_property_readonly("world_size", &Mesh::world_size, "Number of ranks.")
      .def_property_readonly("ndims", &Mesh::ndims, "Number of dims.")
      .def_property_readonly(
          "dims",
          [](const Mesh& self) {
            std::vector<std::pair<std::string, std::int64_t>> out;
            for (const auto& d : self.dims()) out.emplace_back(d.name, d.size);
            return out;
          },
          "[(name, size), ...] outer to inner.")
      .def_property_readonly(
          "names",
          [](const Mesh& self) {
            std::vector<std::string> out;
            for (const auto& d : self.dims()) out.push_back(d.name);
            return out;
          },
          "Dim names outer to inner.")
      .def_property_readonly("order_string", &Mesh::order_string,
                             "The order fastest first, Megatron's convention ('tp-cp-pp-dp').")
      .def("__str__", &Mesh::to_string)
      .def("__repr__", [](const Mesh& self) { return fmt::format("ndmesh.Mesh('{}')", self.to_string()); })
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a == b; })
      .def("__hash__", [](const Mesh& self) { return py::hash(py::str(self.to_string())); })
      // Pickled as its text form, so a Mesh crosses into torch.multiprocessing workers.
      .def(py::pickle([](const Mesh& self) { return self.to_string(); },
                      [](const std::string& text) { return Mesh::parse(text); }))
      .def(
          "size_of", [](const Mesh& self, const std::string& name) { return self.size_of(name); }, "name"_a,
          "Size of the named dim; 1 when the mesh has no such dim.\n\n>>> ndmesh.Mesh(tp=2, "
          "dp=2).size_of('tp'), ndmesh.Mesh('a=2').size_of('tp')\n(2, 1)")
      .def(
          "index", [](const Mesh& self, const std::string& name) { return self.index(name); }, "name"_a,
          "Index of the named dim (0 = outermost); ConfigError when absent.\n\n>>> ndmesh.Mesh(tp=2, "
          "dp=2).index('tp')\n3")
      .def("coords", &coords_dict, "rank"_a,
           "{dim name: coordinate} of a rank.\n\n>>> ndmesh.Mesh(dp=2, tp=2).coords(3)\n{'dp': 1, 'pp': 0, "
           "'cp': 0, 'tp': 1}")
      .def(
          "rank",
          [](const Mesh& self, const py::object& coords) {
            Coords c;
            c.ndims = self.ndims();
            if (py::isinstance<py::dict>(coords)) {
              for (auto [k, v] : coords.cast<py::dict>())
                c[self.index(k.cast<std::string>())] = v.cast<std::int64_t>();
            } else {
              auto values = coords.cast<std::vector<std::int64_t>>();
              NDMESH_CHECK_CONFIG(static_cast<int>(values.size()) == self.ndims(), "mesh",
                                  "{} coordinates for the {} dims of {}; give one per dim, outer to inner",
                                  values.size(), self.ndims(), self.to_string());
              for (int i = 0; i < self.ndims(); ++i) c[i] = values[i];
            }
            return self.rank(c);
          },
          "coords"_a,
          "The rank at coordinates given as {name: coord} (missing dims are 0) or a list outer to "
          "inner.\n\n>>> m = ndmesh.Mesh(dp=2, tp=2)\n>>> m.rank({'dp': 1, 'tp': 1}), m.rank([1, 0, 0, "
          "0])\n(3, 2)")
      .def(
          "group",
          [](const Mesh& self, std::int64_t rank, const py::object& dims) {
            self.coords(rank);  // validates the rank
            return group_list(self.group(rank, to_dims(self, dims)));
          },
          "rank"_a, "dims"_a,
          "Members of the group of `dims` ('dp-cp', 'dp,cp' or ['dp', 'cp']) that holds `rank`, row-major "
          "over those dims in mesh order.\n\n>>> ndmesh.Mesh(dp=2, cp=2, tp=2).group(5, 'dp-cp')\n[1, 3, 5, "
          "7]")
      .def(
          "groups",
          [](const Mesh& self, const py::object& dims) {
            py::list out;
            self.for_each_group(to_dims(self, dims),
                                [&](std::int64_t, const GroupView& g) { out.append(group_list(g)); });
            return out;
          },
          "dims"_a,
          "Every group of `dims`, in color order: what torch.distributed.new_group needs, one list "
          "each.\n\n>>> ndmesh.Mesh(dp=2, tp=2).groups('dp')\n[[0, 2], [1, 3]]")
      .def(
          "group_size",
          [](const Mesh& self, const py::object& dims) { return self.group_size(to_dims(self, dims)); },
          "dims"_a,
          "Size of every group of `dims`.\n\n>>> ndmesh.Mesh(dp=2, cp=2, tp=2).group_size('dp-cp')\n4")
      .def(
          "num_groups",
          [](const Mesh& self, const py::object& dims) { return self.num_groups(to_dims(self, dims)); },
          "dims"_a,
          "How many groups `dims` splits the world into.\n\n>>> ndmesh.Mesh(dp=2, cp=2, "
          "tp=2).num_groups('tp')\n4")
      .def(
          "color",
          [](const Mesh& self, std::int64_t rank, const py::object& dims) {
            self.coords(rank);
            return self.color(rank, to_dims(self, dims));
          },
          "rank"_a, "dims"_a,
          "Index of the group of `dims` holding `rank` (the split color).\n\n>>> ndmesh.Mesh(dp=2, "
          "tp=2).color(3, 'dp')\n1")
      .def(
          "key",
          [](const Mesh& self, std::int64_t rank, const py::object& dims) {
            self.coords(rank);
            return self.key(rank, to_dims(self, dims));
          },
          "rank"_a, "dims"_a,
          "Index of `rank` inside its group of `dims` (the split key).\n\n>>> ndmesh.Mesh(dp=2, tp=2).key(3, "
          "'dp')\n1")
      .def(
          "group_label",
          [](const Mesh& self, std::int64_t rank, const py::object& dims) {
            self.coords(rank);
            return self.group_label(rank, to_dims(self, dims));
          },
          "rank"_a, "dims"_a,
          "A readable id of the group, e.g. 'dp_group_tp1_pp0'.\n\n>>> ndmesh.Mesh(dp=2, "
          "tp=2).group_label(3, 'dp')\n'dp_group_pp0_cp0_tp1'")
      .def(
          "key_name",
          [](const Mesh& self, const py::object& dims) { return self.key_name(to_dims(self, dims)); },
          "dims"_a,
          "The dims joined by '-' in mesh order: the name of the group kind ('dp-cp').\n\n>>> "
          "ndmesh.Mesh(dp=2, cp=2).key_name('cp,dp')\n'dp-cp'")
      .def(
          "neighbour",
          [](const Mesh& self, std::int64_t rank, const py::object& dim, std::int64_t offset,
             const std::string& edge) {
            self.coords(rank);
            return opt(self.neighbour(rank, to_dim(self, dim), offset, to_edge(edge)));
          },
          "rank"_a, "dim"_a, "offset"_a = 1, "edge"_a = "ring",
          "The rank `offset` steps along `dim` (name or index); edge='ring' wraps, edge='line' gives None "
          "past "
          "the ends (pipeline stages).\n\n>>> m = ndmesh.Mesh(pp=4)\n>>> m.neighbour(3, 'pp'), "
          "m.neighbour(3, 'pp', edge='line')\n(0, None)")
      .def(
          "first",
          [](const Mesh& self, std::int64_t rank, const py::object& dim) {
            self.coords(rank);
            return self.first(rank, to_dim(self, dim));
          },
          "rank"_a, "dim"_a,
          "The rank with coordinate 0 along `dim`, the other coordinates as `rank`'s.\n\n>>> "
          "ndmesh.Mesh(pp=2, tp=2).first(3, 'pp')\n1")
      .def(
          "last",
          [](const Mesh& self, std::int64_t rank, const py::object& dim) {
            self.coords(rank);
            return self.last(rank, to_dim(self, dim));
          },
          "rank"_a, "dim"_a,
          "The rank with the last coordinate along `dim`, the other coordinates as `rank`'s.\n\n>>> "
          "ndmesh.Mesh(pp=2, tp=2).last(1, 'pp')\n3")
      .def_static(
          "placement",
          [](std::int64_t rank, std::int64_t ranks_per_node) {
            NDMESH_CHECK_CONFIG(ranks_per_node >= 1, "config", "--ranks-per-node {} must be at least 1",
                                ranks_per_node);
            const auto p = Mesh::placement(rank, ranks_per_node);
            return std::pair{p.node, p.local_rank};
          },
          "rank"_a, "ranks_per_node"_a,
          "(node, local_rank) when consecutive ranks fill nodes of ranks_per_node.\n\n>>> "
          "ndmesh.Mesh.placement(13, 8)\n(1, 5)")
      .def(
          "group_placement",
          [](const Mesh& self, const py::object& dims, std::int64_t ranks_per_node) {
            NDMESH_CHECK_CONFIG(ranks_per_node >= 1, "config", "--ranks-per-node {} must be at least 1",
                                ranks_per_node);
            const auto p = self.group_placement(to_dims(self, dims), ranks_per_node);
            return py::dict("groups"_a = p.groups, "groups_crossing_nodes"_a = p.groups_crossing,
                            "max_nodes_spanned"_a = p.max_nodes_spanned);
          },
          "dims"_a, "ranks_per_node"_a,
          "How the groups of `dims` sit on nodes (the keys of `ndmesh mesh --json`).\n\n>>> "
          "ndmesh.Mesh(dp=2, tp=8).group_placement('dp', 8)\n{'groups': 8, 'groups_crossing_nodes': 8, "
          "'max_nodes_spanned': 2}")
      .def_static(
          "permutation", &Mesh::permutation, "source"_a, "target"_a,
          "perm[r]: the rank of `target` with the same named coordinates as rank r of `source`.\n\n>>> "
          "ndmesh.Mesh.permutation(ndmesh.Mesh('dp=2,tp=2'), ndmesh.Mesh('tp=2,dp=2'))\n[0, 2, 1, 3]")
      .def(
          "to_dict",
          [](const Mesh& self, const py::object& groups, std::int64_t ranks_per_node) {
            return mesh_dict(self, groups, ranks_per_node);
          },
          "groups"_a = py::none(), "ranks_per_node"_a = 0,
          "What `ndmesh mesh --json` prints: world_size, dims, the groups of each kind in `groups` (default "
          "every single dim) and, with ranks_per_node, their placement.\n\n>>> ndmesh.Mesh(dp=2, "
          "tp=2).to_dict(groups='tp')\n{'world_size': 4, 'dims': [{'name': 'dp', 'size': 2}, {'name': 'pp', "
          "'size': 1}, {'name': 'cp', 'size': 1}, {'name': 'tp', 'size': 2}], 'groups': {'tp': [[0, 1], [2, "
          "3]]}}")
      .def(
          "view",
          [](const Mesh& self, std::int64_t rank, const py::object& groups, std::int64_t ranks_per_node) {
            return rank_dict(self, rank, groups, ranks_per_node);
          },
          "rank"_a, "groups"_a = py::none(), "ranks_per_node"_a = 0,
          "One rank's view, what `ndmesh mesh --rank R --json` prints: coords, node, groups, "
          "neighbours.\n\n>>> ndmesh.Mesh(dp=2, tp=2).view(3, groups='dp')['groups']\n{'dp': [1, 3]}");

  auto problems_fn = [](const Mesh& mesh, const py::object& model, const std::string& schedule,
                        std::int64_t vpp, bool sequence_parallel, std::int64_t micro_batch,
                        std::int64_t global_batch, std::int64_t ranks_per_node) {
    const ParallelConfig c =
        to_config(mesh, schedule, vpp, sequence_parallel, micro_batch, global_batch, ranks_per_node);
    std::optional<ModelSpec> spec;
    if (!model.is_none()) spec = to_model(model.cast<py::dict>());
    return std::pair{c, spec};
  };
  m.def(
      "problems",
      [problems_fn](const Mesh& mesh, const py::object& model, const std::string& schedule, std::int64_t vpp,
                    bool sequence_parallel, std::int64_t micro_batch, std::int64_t global_batch,
                    std::int64_t ranks_per_node) {
        auto [c, spec] = problems_fn(mesh, model, schedule, vpp, sequence_parallel, micro_batch, global_batch,
                                     ranks_per_node);
        return problems(c, spec ? &*spec : nullptr);
      },
      "mesh"_a, py::kw_only(), "model"_a = py::none(), "schedule"_a = "1f1b", "vpp"_a = 1,
      "sequence_parallel"_a = false, "micro_batch"_a = 1, "global_batch"_a = 0, "ranks_per_node"_a = 0,
      "Every problem with a layout and training options (and a model: a dict of layers, hidden, heads, "
      "kv_heads, "
      "ffn, seq, vocab, experts), one line each, as the C++ config validation finds them. [] when "
      "valid.\n\n>>> ndmesh.problems(ndmesh.Mesh(pp=2, dp=2), micro_batch=2, global_batch=4)\n[]");
  m.def(
      "validate",
      [problems_fn](const Mesh& mesh, const py::object& model, const std::string& schedule, std::int64_t vpp,
                    bool sequence_parallel, std::int64_t micro_batch, std::int64_t global_batch,
                    std::int64_t ranks_per_node) {
        auto [c, spec] = problems_fn(mesh, model, schedule, vpp, sequence_parallel, micro_batch, global_batch,
                                     ranks_per_node);
        validate(c, spec ? &*spec : nullptr);
      },
      "mesh"_a, py::kw_only(), "model"_a = py::none(), "schedule"_a = "1f1b", "vpp"_a = 1,
      "sequence_parallel"_a = false, "micro_batch"_a = 1, "global_batch"_a = 0, "ranks_per_node"_a = 0,
      "Like problems(), but raises one ConfigError listing every problem (the message `ndmesh mesh --config` "
      "prints), or returns None.\n\n>>> ndmesh.validate(ndmesh.Mesh(tp=2, dp=2), model={'layers': 2, "
      "'hidden': 64, 'heads': 4, 'vocab': 128, 'seq': 16})");

  m.def("plan", &plan_search, "model"_a, py::kw_only(), "gpus"_a, "global_batch"_a, "hardware"_a = "h100",
        "seq"_a = 0, "precision"_a = "mixed", "top"_a = 10, "no_dropout"_a = false, "attention"_a = "flash",
        "Searches every layout (tp, cp, pp, dp, vpp, micro-batch, schedule, recompute, ZeRO) of a model on "
        "`gpus` "
        "GPUs; returns the dict `ndmesh plan --json` prints, layouts best first.\n\n"
        "model: a preset name ('llama3-8b', 'gpt3-175b', ...) or a dict {layers, hidden, heads, vocab, seq, "
        "kv_heads, ffn, mlp: 'gelu'|'swiglu', preset: start from}. hardware: 'a100-80gb', 'h100', 'h200' or "
        "a dict "
        "{preset, gpu_memory_gib, reserved_gib, peak_tflops, efficiency, intra_node_gbps, inter_node_gbps, "
        "gpus_per_node}. precision: 'mixed' or 'fp32'. attention: 'flash' (no s x s scores stored) or "
        "'standard'.\n\n>>> ndmesh._ndmesh.plan('llama3-8b', gpus=8, global_batch=64, "
        "top=1)['layouts'][0]['dp']\n8");
  m.def("plan_memory", &plan_memory, "model"_a, py::kw_only(), "tp"_a = 1, "cp"_a = 1, "pp"_a = 1, "dp"_a = 1,
        "vpp"_a = 1, "micro_batch"_a = 1, "schedule"_a = "1f1b", "recompute"_a = "none",
        "sequence_parallel"_a = false, "zero"_a = 0, "global_batch"_a = 0, "hardware"_a = "h100", "seq"_a = 0,
        "precision"_a = "mixed", "no_dropout"_a = false, "attention"_a = "flash", "pp_layers"_a = "",
        "Memory per GPU and time per step of one layout: the dict `ndmesh plan memory --json` prints. "
        "global_batch 0 means micro_batch * dp * pp; pp_layers: blocks per pipeline chunk, e.g. '3,3,2' "
        "(default balanced).\n\n>>> m = ndmesh.plan_memory('llama3-8b', tp=2, dp=4, zero=1)\n>>> "
        "m['memory_bytes']['total'] < m['capacity_bytes']\nTrue");
  m.def(
      "model_presets",
      [] {
        std::vector<std::string> out;
        for (const auto& p : plan::model_presets()) out.push_back(p.name);
        return out;
      },
      "Names of the model presets.\n\n>>> 'llama3-8b' in ndmesh.model_presets()\nTrue");
  m.def(
      "hardware_presets",
      [] {
        std::vector<std::string> out;
        for (const auto& h : plan::hardware_presets()) out.push_back(h.name);
        return out;
      },
      "Names of the hardware presets.\n\n>>> ndmesh.hardware_presets()\n['a100-80gb', 'h100', 'h200']");

  m.def("_train", &train_json, "options"_a,
        "Trains in this process (one rank, or each rank under torchrun or mpirun) as `ndmesh train` does with "
        "these options (its flags with underscores); the --json report as JSON text. ndmesh.train() wraps it.");
  m.def(
      "_gpus_per_node", [](const py::object& hardware) { return to_hardware(hardware).gpus_per_node; },
      "hardware"_a, "GPUs per node of a hardware preset name or dict (for ndmesh.plan's torchrun command).");

  py::class_<pp::PipelineSchedule>(m, "PipelineSchedule",
                                   "The actions of every pipeline stage for one step (make_schedule()).")
      .def_property_readonly("kind",
                             [](const pp::PipelineSchedule& s) { return std::string(schedule_name(s.kind)); })
      .def_readonly("stages", &pp::PipelineSchedule::stages)
      .def_readonly("microbatches", &pp::PipelineSchedule::microbatches)
      .def_readonly("chunks", &pp::PipelineSchedule::chunks)
      .def_property_readonly(
          "actions",
          [](const pp::PipelineSchedule& s) {
            py::list stages;
            for (const auto& list : s.actions) {
              py::list actions;
              for (const auto& a : list) actions.append(action_dict(a));
              stages.append(actions);
            }
            return stages;
          },
          "actions[stage]: [{kind, microbatch, chunk[, peer]}, ...] in execution order.")
      .def("__repr__", [](const pp::PipelineSchedule& s) {
        return fmt::format("ndmesh.PipelineSchedule('{}', stages={}, microbatches={}, chunks={})",
                           schedule_name(s.kind), s.stages, s.microbatches, s.chunks);
      });

  m.def(
      "make_schedule",
      [](const std::string& schedule, int stages, int microbatches, int chunks) {
        const Schedule kind = parse_schedule(schedule);
        if (chunks == 0) chunks = kind == Schedule::kInterleaved ? 2 : 1;
        auto s = pp::make_schedule(
            {.schedule = kind, .stages = stages, .microbatches = microbatches, .chunks = chunks});
        pp::check_schedule(s);
        return s;
      },
      "schedule"_a = "1f1b", py::kw_only(), "stages"_a = 4, "microbatches"_a = 8, "chunks"_a = 0,
      "Generates a pipeline schedule: 'gpipe', '1f1b', 'interleaved' (chunks virtual stages per rank, "
      "default 2) "
      "or 'zb-h1'. Checked for deadlocks before it is returned.\n\n>>> s = ndmesh.make_schedule('1f1b', "
      "stages=2, microbatches=2)\n>>> s\nndmesh.PipelineSchedule('1f1b', stages=2, microbatches=2, "
      "chunks=1)\n>>> [a['kind'] for a in s.actions[1]]\n['recv-activation', 'forward', 'recv-activation', "
      "'backward', 'send-gradient', 'forward', 'backward', 'send-gradient']");
  m.def(
      "simulate",
      [](const pp::PipelineSchedule& s, double forward, double backward_input, double backward_weight,
         double p2p) {
        const auto sim = pp::simulate(s, to_costs(forward, backward_input, backward_weight, p2p));
        py::list spans;
        for (const auto& stage : sim.spans) {
          py::list row;
          for (const auto& span : stage) row.append(py::make_tuple(span.start, span.end));
          spans.append(row);
        }
        return py::dict("makespan"_a = sim.makespan, "bubble_fraction"_a = sim.bubble_fraction,
                        "busy"_a = sim.busy, "peak_in_flight"_a = sim.peak_in_flight,
                        "peak_in_flight_chunks"_a = sim.peak_in_flight_chunks, "spans"_a = spans);
      },
      "schedule"_a, py::kw_only(), "forward"_a = 1.0, "backward_input"_a = 1.0, "backward_weight"_a = 1.0,
      "p2p"_a = 0.0,
      "Times the schedule with these per-stage costs: {makespan, bubble_fraction, busy, peak_in_flight, "
      "peak_in_flight_chunks, spans[stage][action] = (start, end)}, the numbers of `ndmesh schedule "
      "--json`.\n\n>>> round(ndmesh.simulate(ndmesh.make_schedule('gpipe', stages=4, "
      "microbatches=4))['bubble_fraction'], 3)\n0.429");
  m.def(
      "svg_timeline",
      [](const pp::PipelineSchedule& s, double forward, double backward_input, double backward_weight,
         double p2p) {
        return pp::svg_timeline(s, pp::simulate(s, to_costs(forward, backward_input, backward_weight, p2p)));
      },
      "schedule"_a, py::kw_only(), "forward"_a = 1.0, "backward_input"_a = 1.0, "backward_weight"_a = 1.0,
      "p2p"_a = 0.0,
      "The SVG picture of the simulated timeline (what `ndmesh schedule --svg` writes), as a str.\n\n>>> "
      "ndmesh.svg_timeline(ndmesh.make_schedule('gpipe', stages=2, "
      "microbatches=2)).startswith('<svg')\nTrue");
  m.def(
      "ascii_timeline",
      [](const pp::PipelineSchedule& s, double forward, double backward_input, double backward_weight,
         double p2p) {
        return pp::ascii_timeline(s,
                                  pp::simulate(s, to_costs(forward, backward_input, backward_weight, p2p)));
      },
      "schedule"_a, py::kw_only(), "forward"_a = 1.0, "backward_input"_a = 1.0, "backward_weight"_a = 1.0,
      "p2p"_a = 0.0,
      "The ASCII timeline `ndmesh schedule` prints, one line per stage.\n\n>>> "
      "print(ndmesh.ascii_timeline(ndmesh.make_schedule('gpipe', stages=2, microbatches=2)))\nstage 0 |F0 F1 "
      ".  .  .  B0 -- B1 --| in flight 2\nstage 1 |.  F0 F1 B0 -- B1 -- .  . | in flight 2\n        1 cell = "
      "1 time units; F forward, B backward, . idle");
}

}  // namespace
}  // namespace ndmesh::python

PYBIND11_MODULE(_ndmesh, m) { ndmesh::python::bind(m); }
