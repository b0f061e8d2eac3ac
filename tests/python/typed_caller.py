"""A caller of every kind of ndmesh call, type-checked against the package's stubs by
`mypy --strict` in pip_install.sh: a stub that disagrees with how the calls are used fails."""
from typing import Any, Dict, List, Optional, Tuple

import ndmesh
import ndmesh.torch

mesh: ndmesh.Mesh = ndmesh.Mesh(dp=2, pp=2, tp=2)
named: ndmesh.Mesh = ndmesh.Mesh("pipe=2,data=4")
pairs: ndmesh.Mesh = ndmesh.Mesh([("pipe", 2), ("data", 4)])
version: str = ndmesh.__version__
world: int = mesh.world_size
dims: List[Tuple[str, int]] = mesh.dims
members: List[int] = mesh.group(5, "dp-tp")
every: List[List[int]] = mesh.groups(["dp", "tp"])
coords: Dict[str, int] = mesh.coords(5)
back: int = mesh.rank(coords)
prev: Optional[int] = mesh.neighbour(5, "pp", edge="line")
node: Tuple[int, int] = ndmesh.Mesh.placement(9, 8)
layout: Dict[str, Any] = mesh.to_dict(groups="tp,dp-pp", ranks_per_node=4)
issues: List[str] = ndmesh.problems(mesh, micro_batch=2, global_batch=8)
ndmesh.validate(mesh)
result: Dict[str, Any] = ndmesh.plan("llama3-8b", gpus=8, global_batch=64, top=1)
launch: Dict[str, Any] = ndmesh.launch_of(result["layouts"][0], gpus_per_node=8)
memory: Dict[str, Any] = ndmesh.plan_memory("llama3-8b", tp=2, dp=4)
presets: List[str] = ndmesh.model_presets() + ndmesh.hardware_presets()
schedule: ndmesh.PipelineSchedule = ndmesh.make_schedule("interleaved", stages=4, microbatches=8)
timing: Dict[str, Any] = ndmesh.simulate(schedule, p2p=0.1)
svg: str = ndmesh.svg_timeline(schedule) + ndmesh.ascii_timeline(schedule)
report: Dict[str, Any] = ndmesh.train(steps=3, layers=1, eval_every=2, lr_schedule="wsd", untied=True)
reason: Optional[str] = ndmesh.torch.device_mesh_unavailable()
try:
    ndmesh.Mesh(tp=3, world=8)
except ndmesh.ConfigError as e:
    component: str = e.component


def in_a_torch_job() -> Dict[str, Any]:
    groups: Dict[str, Any] = ndmesh.torch.process_groups(mesh, "tp,dp-pp")
    return ndmesh.torch.check(mesh, groups)
