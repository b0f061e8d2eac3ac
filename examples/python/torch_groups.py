#!/usr/bin/env python3
"""PyTorch process groups from an ndmesh Mesh, in one pass, checked against `ndmesh check`.

ndmesh's Mesh is the one place that knows the rank layout; this example creates the
groups of every combination of the dims of a 4D layout (dp, pp, cp, tp: 15 kinds) with
ndmesh.torch.process_groups, checks each one by communication with ndmesh.torch.check
(all_reduce of the ranks = their sum, all_gather = the members in order, the group rank =
the mesh key) and checks the whole layout against ndmesh itself:
`ndmesh mesh --json` must list the same members, and `ndmesh check --json` (the same
layout verified by ndmesh's own MPI communicators under mpirun) the same number and size
of groups per kind with no failures.

Run it on one machine (it starts the ranks itself, gloo backend on CPU):

    PYTHONPATH=build/python python3 examples/python/torch_groups.py --dp 2 --pp 2 --cp 1 --tp 2

or under torchrun (one process per rank; rank 0 runs the ndmesh comparison):

    PYTHONPATH=build/python torchrun --nproc-per-node 8 examples/python/torch_groups.py

torch is not a dependency of ndmesh: without it the example prints SKIPPED and exits 77
(what ctest's SKIP_RETURN_CODE reports as skipped). Exit 0 when everything matches, 1 on
any mismatch.

The core of it, for your own training script (ndmesh.torch creates every group of every
kind with dist.new_group, in the same order on every rank, and keeps this rank's):

    mesh = ndmesh.Mesh(dp=2, pp=2, cp=1, tp=2)
    groups = ndmesh.torch.process_groups(mesh, "tp,cp,pp,dp,dp-cp")  # {kind: ProcessGroup}
    ndmesh.torch.check(mesh, groups)                                  # proven by communication
    dm = ndmesh.torch.device_mesh(mesh)                               # PyTorch 2.2+: a DeviceMesh
"""
import argparse
import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile

SKIP = 77


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for dim, default in (("dp", 2), ("pp", 2), ("cp", 1), ("tp", 2)):
        p.add_argument(f"--{dim}", type=int, default=default, help=f"{dim} size (default {default})")
    p.add_argument("--ndmesh", default=os.environ.get("NDMESH_BIN", "build/bin/ndmesh"),
                   help="the ndmesh command (default: $NDMESH_BIN or build/bin/ndmesh)")
    p.add_argument("--mpirun", default="mpirun --allow-run-as-root --oversubscribe",
                   help="how to start the ranks of `ndmesh check` (default: %(default)s)")
    return p.parse_args()


def all_kinds(mesh):
    """Every non-empty combination of the mesh's dims, as 'dp-cp' names, in a fixed order."""
    names = mesh.names
    return [mesh.key_name(list(c)) for n in range(1, len(names) + 1) for c in itertools.combinations(names, n)]


def build_and_check_groups(mesh, kinds, rank):
    """Creates every group of every kind in one pass (ndmesh.torch.process_groups) and checks
    each by communication (ndmesh.torch.check: members, all_reduce, all_gather, group rank;
    a mismatch raises ndmesh.ConfigError naming the group on every rank).
    Returns ({kind: members seen by torch}, [failure lines])."""
    import torch.distributed as dist
    import ndmesh
    import ndmesh.torch

    groups = ndmesh.torch.process_groups(mesh, kinds)
    seen = {kind: dist.get_process_group_ranks(group) for kind, group in groups.items()}
    try:
        ndmesh.torch.check(mesh, groups)
    except ndmesh.ConfigError as e:
        return seen, [str(e)]
    return seen, []


def worker(rank, world, init_method, sizes, result_path):
    import torch.distributed as dist
    import ndmesh

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    mesh = ndmesh.Mesh(**sizes)
    kinds = all_kinds(mesh)
    seen, failures = build_and_check_groups(mesh, kinds, rank)
    everything = [None] * world
    dist.all_gather_object(everything, {"seen": seen, "failures": failures})
    if rank == 0 and result_path:
        with open(result_path, "w") as f:
            json.dump(everything, f)
    dist.barrier()
    dist.destroy_process_group()
    return everything


def compare_with_ndmesh(args, mesh, kinds, everything):
    """Mismatches between the torch groups and ndmesh's own answers (`mesh` and `check`)."""
    flags = [f"--{d}={s}" for d, s in (("dp", args.dp), ("pp", args.pp), ("cp", args.cp), ("tp", args.tp))]
    groups = ",".join(kinds)
    problems = [f for r in everything for f in r["failures"]]
    layout = json.loads(subprocess.run([args.ndmesh, "mesh", *flags, "--groups", groups, "--json"],
                                       check=True, capture_output=True, text=True).stdout)
    for kind in kinds:
        torch_groups = sorted({tuple(r["seen"][kind]) for r in everything})
        if [list(g) for g in torch_groups] != sorted(layout["groups"][kind]):
            problems.append(f"{kind}: torch groups {torch_groups} but `ndmesh mesh` lists {layout['groups'][kind]}")
    cmd = shlex.split(args.mpirun) + ["-np", str(mesh.world_size), args.ndmesh, "check", *flags,
                                      "--groups", groups, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, NDMESH_TIMEOUT_S="60"))
    line = next((l for l in out.stdout.splitlines() if l.startswith("{")), None)
    if out.returncode != 0 or line is None:
        return problems + [f"`{' '.join(cmd)}` exited {out.returncode}: {out.stderr.strip()}"]
    check = json.loads(line)
    if not check["ok"]:
        problems.append(f"ndmesh check found {check['groups_failed']} bad groups")
    by_kind = {k["kind"]: k for k in check["kinds"]}
    for kind in kinds:
        k = by_kind.get(kind)
        want = (mesh.num_groups(kind), mesh.group_size(kind))
        if k is None or (k["groups"], k["size"]) != want:
            problems.append(f"{kind}: ndmesh check reports {k}, torch built {want[0]} groups of {want[1]}")
    print(f"ndmesh check: {check['groups_verified']} groups of {len(by_kind)} kinds verified over MPI "
          f"({check['splits']} splits); torch built the same groups")
    return problems


def main():
    args = parse_args()
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError:
        print("SKIPPED: torch is not installed; this example needs PyTorch (pip install torch, CPU build is enough)")
        return SKIP
    if not dist.is_available():
        print("SKIPPED: this torch build has no torch.distributed")
        return SKIP
    import ndmesh

    sizes = dict(dp=args.dp, pp=args.pp, cp=args.cp, tp=args.tp)
    mesh = ndmesh.Mesh(**sizes)
    kinds = all_kinds(mesh)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world != mesh.world_size:
            print(f"torchrun started {world} ranks but the mesh {mesh} has {mesh.world_size}; "
                  f"use --nproc-per-node {mesh.world_size}", file=sys.stderr)
            return 2
        everything = worker(rank, world, "env://", sizes, None)
        if rank != 0:
            return 0
    else:
        with tempfile.TemporaryDirectory() as d:
            result = os.path.join(d, "result.json")
            init = "file://" + os.path.join(d, "rendezvous")
            mp.spawn(worker, args=(mesh.world_size, init, sizes, result), nprocs=mesh.world_size, join=True)
            with open(result) as f:
                everything = json.load(f)
    print(f"torch: mesh {mesh}, {len(kinds)} kinds, "
          f"{sum(mesh.num_groups(k) for k in kinds)} groups created by ndmesh.torch.process_groups and checked by ndmesh.torch.check")
    problems = compare_with_ndmesh(args, mesh, kinds, everything)
    for p in problems:
        print("MISMATCH:", p)
    print("all groups match ndmesh" if not problems else f"{len(problems)} mismatches")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
