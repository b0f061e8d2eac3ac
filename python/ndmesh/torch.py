"""PyTorch interop: an ndmesh Mesh as torch.distributed process groups and a DeviceMesh.

torch is not a dependency of ndmesh: it is imported when one of these is called. Every
rank calls them in the same order after torch.distributed.init_process_group (torchrun
sets the variables it reads); the Mesh answers which ranks form each group, so the groups
are the ones `ndmesh mesh --json` lists.

    mesh = ndmesh.Mesh(dp=2, cp=2, tp=2)
    groups = ndmesh.torch.process_groups(mesh, "tp,dp-cp")  # {'tp': ProcessGroup, 'dp-cp': ...}
    ndmesh.torch.check(mesh, groups)                         # every group proven by communication
    dm = ndmesh.torch.device_mesh(mesh)                      # DeviceMesh (PyTorch 2.2 or newer)

Errors are ndmesh's Python errors: ndmesh.ConfigError (a ValueError) for a layout that does
not fit the job or a group that does not hold what the mesh says, naming the group.

The examples below run on a one-rank Gloo job:

>>> import tempfile, torch.distributed as dist
>>> dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, Iterable, List, Optional, Union

from . import ConfigError, Error, Mesh, _error

__all__ = ["check", "device_mesh", "device_mesh_unavailable", "process_groups"]

Kinds = Union[str, Iterable[Union[str, Iterable[str]]], None]


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise ImportError(f"ndmesh.torch needs PyTorch (pip install torch; a CPU build is enough): {e}") from e
    if not dist.is_available():
        raise _error(Error, "torch", "this torch build has no torch.distributed; install a build that has it")
    return dist


def _initialized(mesh: Mesh) -> Any:
    """torch.distributed, checked to be initialized with as many ranks as the mesh."""
    dist = _dist()
    if not dist.is_initialized():
        raise _error(
            ConfigError,
            "torch",
            "torch.distributed is not initialized; call torch.distributed.init_process_group() first "
            "(under torchrun it reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)",
        )
    world = dist.get_world_size()
    if world != mesh.world_size:
        raise _error(
            ConfigError,
            "torch",
            f"the mesh {mesh} has {mesh.world_size} ranks but torch.distributed has {world}; "
            f"start {mesh.world_size} ranks (torchrun --nproc_per_node={mesh.world_size}) or use a mesh of {world}",
        )
    return dist


def _kind_names(mesh: Mesh, kinds: Kinds) -> List[str]:
    """Group kinds as mesh.key_name() gives them ('dp-cp'), in the order given, without repeats.
    None: every single dim; a str: kinds separated by ',' ('tp,dp-cp'); else a list of kinds."""
    if kinds is None:
        items: List[Any] = list(mesh.names)
    elif isinstance(kinds, str):
        items = [k for k in kinds.split(",") if k]
    else:
        items = list(kinds)
    names: List[str] = []
    for item in items:
        name = mesh.key_name(item)
        if name not in names:
            names.append(name)
    return names


def process_groups(
    mesh: Mesh, kinds: Kinds = None, *, backend: Optional[str] = None, timeout: Any = None
) -> Dict[str, Any]:
    """This rank's torch.distributed ProcessGroup of each kind of group, created in one pass.

    kinds: 'tp,dp-cp', ['tp', 'dp-cp'] or [['dp', 'cp']] (a kind joins dims: the ranks that
    differ only in them); default every single dim. Every rank creates every group of every
    kind with torch.distributed.new_group, in the same order (new_group is collective over
    the whole job), and keeps those it belongs to. Returns {kind: group}, keyed by
    mesh.key_name(kind) ('dp-cp', dims in mesh order). backend and timeout go to new_group.
    ConfigError when torch.distributed is not initialized or its world is not the mesh's.

    >>> mesh = ndmesh.Mesh(dp=1, tp=1)
    >>> groups = ndmesh.torch.process_groups(mesh, "tp,dp-tp")
    >>> sorted(groups)
    ['dp-tp', 'tp']
    >>> dist.get_process_group_ranks(groups["dp-tp"])
    [0]
    """
    dist = _initialized(mesh)
    rank = dist.get_rank()
    mine: Dict[str, Any] = {}
    extra = {} if timeout is None else {"timeout": timeout}
    for kind in _kind_names(mesh, kinds):
        for ranks in mesh.groups(kind):  # the same order on every rank
            group = dist.new_group(ranks, backend=backend, **extra)
            if rank in ranks:
                mine[kind] = group
    return mine


def device_mesh_unavailable() -> Optional[str]:
    """None where the installed torch has torch.distributed.device_mesh.DeviceMesh (PyTorch 2.2
    or newer), else why not, in one line.

    >>> reason = ndmesh.torch.device_mesh_unavailable()
    >>> reason is None or "DeviceMesh" in reason
    True
    """
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install torch; a CPU build is enough)"
    try:
        from torch.distributed.device_mesh import DeviceMesh  # noqa: F401
    except ImportError:
        return (
            f"torch {torch.__version__} has no torch.distributed.device_mesh.DeviceMesh (PyTorch 2.2 or newer "
            "has it); use ndmesh.torch.process_groups()"
        )
    return None


def device_mesh(mesh: Mesh, device_type: str = "cpu") -> Any:
    """A torch.distributed.device_mesh.DeviceMesh with the mesh's dims (names and sizes, outer
    to inner) holding the same ranks at the same coordinates, so that dm.get_group(name) holds
    the members of mesh.group(rank, name). device_type: 'cpu' (Gloo) or 'cuda'. ndmesh.Error
    where the installed torch has no DeviceMesh (device_mesh_unavailable() says why), ConfigError
    when torch.distributed is not initialized or its world is not the mesh's.

    >>> mesh = ndmesh.Mesh(dp=1, tp=1)
    >>> dm = ndmesh.torch.device_mesh(mesh) if ndmesh.torch.device_mesh_unavailable() is None else None
    >>> dm is None or dm.mesh_dim_names == ("dp", "tp")
    True
    """
    reason = device_mesh_unavailable()
    if reason is not None:
        raise _error(Error, "torch", reason)
    _initialized(mesh)
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    sizes = [size for _, size in mesh.dims]
    ranks = [mesh.rank(list(c)) for c in itertools.product(*(range(s) for s in sizes))]
    layout = torch.tensor(ranks, dtype=torch.int64).reshape(sizes)
    return DeviceMesh(device_type, layout, mesh_dim_names=tuple(mesh.names))


def check(mesh: Mesh, groups: Optional[Dict[str, Any]] = None, kinds: Kinds = None) -> Dict[str, Any]:
    """Verifies every group by communication, as `ndmesh check` does: torch's members of this
    rank's group of each kind are mesh.group(rank, kind), an all_reduce of the ranks gives
    their sum, an all_gather gives the members in order and the rank in the group is
    mesh.key(rank, kind). groups: {kind: ProcessGroup} (default: process_groups(mesh, kinds)).
    Every rank calls it; a mismatch on any rank raises ConfigError on every rank, naming the
    group ('[torch] group dp-cp (dp_cp_group_tp1) of rank 3: ...'). Members are compared
    before any group communicates, so that a wrong group cannot hang the check; a collective
    that cannot complete ends at the process group's timeout.

    Returns what `ndmesh check --json` reports: {"ok": True, "groups_verified": number of
    groups, "kinds": [{"kind", "groups", "size"}, ...]}.

    >>> mesh = ndmesh.Mesh(dp=1, tp=1)  # dims dp, pp, cp, tp: one group each
    >>> ndmesh.torch.check(mesh)["groups_verified"]
    4
    """
    dist = _initialized(mesh)
    import torch

    if groups is None:
        groups = process_groups(mesh, kinds)
    rank = dist.get_rank()
    world = dist.get_world_size()

    def label(kind: str) -> str:
        return f"group {kind} ({mesh.group_label(rank, kind)}) of rank {rank}"

    def raise_everywhere(failures: List[str]) -> None:
        everyone: List[Any] = [None] * world
        dist.all_gather_object(everyone, failures)
        found = [f for f in itertools.chain.from_iterable(everyone)]
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise _error(ConfigError, "torch", found[0] + more)

    kinds_seen = [mesh.key_name(k) for k in groups]
    failures: List[str] = []
    for kind, group in zip(kinds_seen, groups.values()):
        want = mesh.group(rank, kind)
        members = dist.get_process_group_ranks(group)
        if members != want:
            failures.append(f"{label(kind)}: the process group holds ranks {members}, the mesh says {want}")
    raise_everywhere(failures)

    for kind, group in zip(kinds_seen, groups.values()):
        want = mesh.group(rank, kind)
        total = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(total, group=group)
        gathered = [torch.zeros(1, dtype=torch.int64) for _ in want]
        dist.all_gather(gathered, torch.tensor([rank], dtype=torch.int64), group=group)
        got = [int(t.item()) for t in gathered]
        if int(total.item()) != sum(want):
            failures.append(f"{label(kind)}: all_reduce of the ranks gave {int(total.item())}, want {sum(want)}")
        if got != want:
            failures.append(f"{label(kind)}: all_gather of the ranks gave {got}, want {want}")
        if dist.get_rank(group) != mesh.key(rank, kind):
            failures.append(f"{label(kind)}: rank in the group is {dist.get_rank(group)}, the mesh key {mesh.key(rank, kind)}")
    raise_everywhere(failures)
    return {
        "ok": True,
        "groups_verified": sum(mesh.num_groups(k) for k in kinds_seen),
        "kinds": [{"kind": k, "groups": mesh.num_groups(k), "size": mesh.group_size(k)} for k in kinds_seen],
    }
