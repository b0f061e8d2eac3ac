"""ndmesh: N-dimensional parallel training layouts for Python.

Mesh lays ranks out on named dims (dp, pp, cp, tp, ep or any names) and answers every
layout question: coordinates, the members of any group of any dims, split colors and
keys, neighbours, node placement. train() trains in the calling process as `ndmesh train`
does (one rank, or each rank under torchrun or mpirun) and returns its report. plan()
searches layouts of a model on N GPUs and gives each its torchrun command; make_schedule()/simulate()/svg_timeline() generate, time and
draw pipeline schedules; ndmesh.torch turns a Mesh into PyTorch process groups and a
DeviceMesh. Errors: ConfigError (ValueError), IoError (OSError), Error (RuntimeError),
with the same one-line messages as the ndmesh command.

>>> import ndmesh
>>> mesh = ndmesh.Mesh(dp=2, pp=2, tp=2)
>>> mesh.group(5, "dp")
[1, 5]
>>> ndmesh.__version__ == ndmesh._ndmesh.__version__
True
"""
from __future__ import annotations

import json
import shlex
from typing import Any, Dict, Mapping, Union

from . import _ndmesh
from ._ndmesh import (
    ConfigError,
    Error,
    InternalError,
    IoError,
    Mesh,
    PipelineSchedule,
    __version__,
    ascii_timeline,
    hardware_presets,
    make_schedule,
    model_presets,
    plan_memory,
    problems,
    simulate,
    svg_timeline,
    validate,
)

__all__ = [
    "ConfigError",
    "Error",
    "InternalError",
    "IoError",
    "Mesh",
    "PipelineSchedule",
    "__version__",
    "ascii_timeline",
    "hardware_presets",
    "launch_of",
    "make_schedule",
    "model_presets",
    "plan",
    "plan_memory",
    "problems",
    "simulate",
    "svg_timeline",
    "train",
    "validate",
]

# ndmesh's pipeline schedules by the names torchtitan's --parallelism.pipeline_parallel_schedule
# takes (torch.distributed.pipelining). zb-h1 (zero bubble, one chunk per rank) has no
# one-chunk twin there: InterleavedZeroBubble is the same split of the backward.
_TORCHTITAN_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "zb-h1": "InterleavedZeroBubble",
}

# The mesh order of a torchtitan-style script, outer to inner: pp across nodes, tp innermost.
_TORCHTITAN_ORDER = ("pp", "dp", "cp", "tp")


def launch_of(
    layout: Mapping[str, Any],
    *,
    gpus_per_node: int = 8,
    seq: int = 0,
    global_batch: int = 0,
    script: str = "train.py",
    rdzv_endpoint: str = "$MASTER_ADDR:29500",
) -> Dict[str, Any]:
    """How to run one layout of ndmesh.plan() with torchrun and a torchtitan-style script.

    Returns {"nodes", "nproc_per_node", "dims": [[name, size], ...] outer to inner (pp, dp,
    cp, tp), "mesh": the same as "pp=..,dp=..,cp=..,tp=.." (ndmesh.Mesh(mesh) builds it),
    "args": the script's flags (torchtitan's --parallelism.*, --training.*,
    --activation_checkpoint.mode), "torchrun": the whole command line}. ZeRO 1-3 maps to
    FSDP (data_parallel_shard_degree = dp), no ZeRO to replication
    (data_parallel_replicate_degree = dp). plan() fills layout["launch"] with this.

    >>> layout = {"tp": 8, "cp": 1, "pp": 2, "dp": 4, "vpp": 1, "micro_batch": 1,
    ...           "schedule": "1f1b", "recompute": "selective", "zero": 1}
    >>> run = launch_of(layout, seq=4096, global_batch=256)
    >>> run["nodes"], run["nproc_per_node"], run["mesh"]
    (8, 8, 'pp=2,dp=4,cp=1,tp=8')
    >>> print(run["torchrun"])  # doctest: +NORMALIZE_WHITESPACE
    torchrun --nnodes=8 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 train.py
    --parallelism.data_parallel_replicate_degree=1 --parallelism.data_parallel_shard_degree=4
    --parallelism.tensor_parallel_degree=8 --parallelism.context_parallel_degree=1
    --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=1F1B
    --parallelism.pipeline_parallel_microbatch_size=1 --training.local_batch_size=64
    --training.global_batch_size=256 --training.seq_len=4096 --activation_checkpoint.mode=selective
    """
    sizes = {d: int(layout[d]) for d in _TORCHTITAN_ORDER}
    gpus = 1
    for s in sizes.values():
        gpus *= s
    if gpus_per_node < 1:
        raise _error(ConfigError, "plan", f"gpus_per_node {gpus_per_node} must be at least 1, e.g. 8")
    nproc = min(gpus, gpus_per_node)
    nodes = -(-gpus // nproc)
    dp = sizes["dp"]
    sharded = int(layout.get("zero", 0)) > 0
    args = [
        f"--parallelism.data_parallel_replicate_degree={1 if sharded else dp}",
        f"--parallelism.data_parallel_shard_degree={dp if sharded else 1}",
        f"--parallelism.tensor_parallel_degree={sizes['tp']}",
        f"--parallelism.context_parallel_degree={sizes['cp']}",
        f"--parallelism.pipeline_parallel_degree={sizes['pp']}",
    ]
    if sizes["pp"] > 1:
        args.append(f"--parallelism.pipeline_parallel_schedule={_TORCHTITAN_SCHEDULES[str(layout['schedule'])]}")
        args.append(f"--parallelism.pipeline_parallel_microbatch_size={int(layout['micro_batch'])}")
    if global_batch:
        args.append(f"--training.local_batch_size={global_batch // dp}")
        args.append(f"--training.global_batch_size={global_batch}")
    if seq:
        args.append(f"--training.seq_len={seq}")
    args.append(f"--activation_checkpoint.mode={layout.get('recompute', 'none')}")
    head = ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={nproc}"]
    if nodes > 1:
        head += ["--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}"]
    # $MASTER_ADDR stays for the shell to expand, the rest is quoted where it needs to be.
    command = " ".join(head + [shlex.quote(script)] + [shlex.quote(a) for a in args])
    return {
        "nodes": nodes,
        "nproc_per_node": nproc,
        "dims": [[d, sizes[d]] for d in _TORCHTITAN_ORDER],
        "mesh": ",".join(f"{d}={sizes[d]}" for d in _TORCHTITAN_ORDER),
        "args": args,
        "torchrun": command,
    }


def plan(
    model: Union[str, Dict[str, Any]],
    *,
    gpus: int,
    global_batch: int,
    hardware: Union[str, Dict[str, Any]] = "h100",
    seq: int = 0,
    precision: str = "mixed",
    top: int = 10,
    no_dropout: bool = False,
    attention: str = "flash",
    script: str = "train.py",
) -> Dict[str, Any]:
    """Searches every layout (tp, cp, pp, dp, vpp, micro-batch, schedule, recompute, ZeRO) of a
    model on `gpus` GPUs; returns the dict `ndmesh plan --json` prints, layouts best first, each
    with "launch" added: its torchrun command for `script` and the arguments of a
    torchtitan-style script (launch_of()).

    model: a preset name ('llama3-8b', 'gpt3-175b', ...) or a dict {layers, hidden, heads,
    vocab, seq, kv_heads, ffn, mlp: 'gelu'|'swiglu', preset: start from}. hardware:
    'a100-80gb', 'h100', 'h200' or a dict {preset, gpu_memory_gib, reserved_gib, peak_tflops,
    efficiency, intra_node_gbps, inter_node_gbps, gpus_per_node}. precision: 'mixed' or
    'fp32'. attention: 'flash' (no s x s scores stored) or 'standard'.

    >>> best = ndmesh.plan("llama3-8b", gpus=16, global_batch=64, top=1)["layouts"][0]
    >>> best["dp"] * best["tp"] * best["pp"] * best["cp"]
    16
    >>> best["launch"]["torchrun"].split(" train.py")[0]
    'torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500'
    >>> ndmesh.Mesh(best["launch"]["mesh"]).world_size
    16
    """
    result: Dict[str, Any] = _ndmesh.plan(
        model,
        gpus=gpus,
        global_batch=global_batch,
        hardware=hardware,
        seq=seq,
        precision=precision,
        top=top,
        no_dropout=no_dropout,
        attention=attention,
    )
    per_node = _ndmesh._gpus_per_node(hardware)
    for layout in result["layouts"]:
        layout["launch"] = launch_of(
            layout, gpus_per_node=per_node, seq=result["seq"], global_batch=result["global_batch"], script=script
        )
    return result


def train(**options: Any) -> Dict[str, Any]:
    """Trains in this process as `ndmesh train` does, and returns the dict its --json prints.

    The options are the flags of `ndmesh train --help` with underscores: steps=1000,
    eval_every=100, val_fraction=0.05, lr_schedule="wsd", metrics="run.jsonl", dp=2, tp=2, ...;
    a flag given alone is True (untied=True); None leaves an option out. One process is the
    serial run; under torchrun or mpirun every rank calls train() with the same options and
    trains its part of the layout (world rank 0 prints and writes the files, and its report is
    the run's). Bad options raise ConfigError with the message the command prints; an error on
    one rank of several ends the whole job, as it does for the command; Ctrl-C ends a one-rank
    run between steps.

    >>> report = ndmesh.train(steps=3, layers=1, hidden=16, heads=2, kv_heads=1, seq=8, batch=2,
    ...                       markov_vocab=8, threads=1, eval_batches=1, lr_schedule="linear", warmup=0)
    >>> report["steps"], len(report["losses"]), report["lr_schedule"]
    (3, 3, 'linear')
    >>> ndmesh.train(steps=0)
    Traceback (most recent call last):
    ...
    ndmesh.ConfigError: [train] --steps=0 must be at least 1; e.g. --steps 1000
    """
    result: Dict[str, Any] = json.loads(_ndmesh._train(options))
    return result


def _error(cls: type, component: str, message: str) -> Error:
    """An ndmesh exception raised from Python, shaped as the C++ ones: '[component] message'."""
    e: Error = cls(f"[{component}] {message}")
    e.component = component  # type: ignore[attr-defined]
    return e

