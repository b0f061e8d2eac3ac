"""ndmesh.torch under torchrun with Gloo: the process groups (and the DeviceMesh where the
installed torch has it) hold the members `ndmesh mesh --json` lists, and an all_reduce in
each proves it; ndmesh.torch.check passes on the right groups and raises ConfigError
naming the group on a wrong one; a job of the wrong size or without init_process_group
gets a ConfigError. Every rank runs it:

    PYTHONPATH=build/python NDMESH_BIN=build/bin/ndmesh torchrun --standalone --nproc_per_node=4 \\
        tests/python/torch_interop.py

Exit 0 when every rank passes; the DeviceMesh part prints SKIPPED with the reason where
torch has no DeviceMesh (PyTorch 1.13, Debian 12's)."""
import datetime
import itertools
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist

import ndmesh
import ndmesh.torch

BIN = os.environ.get("NDMESH_BIN", "build/bin/ndmesh")


def expect_config_error(call, *needles):
    try:
        call()
    except ndmesh.ConfigError as e:
        for needle in needles:
            assert needle in str(e), f"ConfigError '{e}' does not name '{needle}'"
        assert e.component == "torch", e.component
        return str(e)
    raise AssertionError(f"no ConfigError (want one naming {needles})")


def all_kinds(mesh):
    names = mesh.names
    return [mesh.key_name(list(c)) for n in range(1, len(names) + 1) for c in itertools.combinations(names, n)]


def cli_groups(flags, kinds):
    out = subprocess.run([BIN, "mesh", *flags, "--groups", ",".join(kinds), "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["groups"]


def prove(group, members, rank, what):
    """all_reduce of the ranks in the group gives their sum: the group holds exactly them."""
    assert dist.get_process_group_ranks(group) == members, \
        f"rank {rank} {what}: torch holds {dist.get_process_group_ranks(group)}, `ndmesh mesh` {members}"
    total = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(total, group=group)
    assert int(total.item()) == sum(members), f"rank {rank} {what}: all_reduce {int(total.item())} != {sum(members)}"


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == 4, f"run with --nproc_per_node=4, not {world}"
    mesh0 = ndmesh.Mesh(dp=2, cp=2, tp=1)
    expect_config_error(lambda: ndmesh.torch.process_groups(mesh0), "not initialized", "init_process_group")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    lines = []

    # Two orders of the same sizes, every combination of dims (dp-cp, cp-tp, dp-cp-tp, ...).
    for flags, mesh in (
        (["--dp=2", "--cp=2", "--tp=1"], mesh0),
        (["--dp=2", "--cp=2", "--tp=1", "--order=cp,tp,dp"], ndmesh.Mesh(dp=2, cp=2, tp=1, order="cp,tp,dp")),
    ):
        kinds = all_kinds(mesh)
        want = cli_groups(flags, kinds)
        groups = ndmesh.torch.process_groups(mesh, kinds)  # one pass, all kinds
        assert list(groups) == kinds, f"kinds {list(groups)} != {kinds}"
        for kind in kinds:
            mine = [g for g in want[kind] if rank in g]
            assert len(mine) == 1, (kind, want[kind])
            prove(groups[kind], mine[0], rank, f"{mesh} {kind}")
        report = ndmesh.torch.check(mesh, groups)
        assert report["ok"] and report["groups_verified"] == sum(len(want[k]) for k in kinds), report
        lines.append(f"{mesh}: {len(kinds)} kinds, {report['groups_verified']} groups equal `ndmesh mesh --json`'s, "
                     f"all_reduce and ndmesh.torch.check pass")

    # A combined kind given as a list, and the default (every single dim).
    mesh = ndmesh.Mesh(dp=2, cp=2, tp=1)
    assert list(ndmesh.torch.process_groups(mesh, [["cp", "dp"]])) == ["dp-cp"]
    assert list(ndmesh.torch.process_groups(mesh)) == mesh.names, mesh.names

    # A wrong group fails on every rank, naming the group.
    groups = ndmesh.torch.process_groups(mesh, "dp,cp")
    msg = expect_config_error(lambda: ndmesh.torch.check(mesh, {"dp": groups["cp"], "cp": groups["cp"]}),
                              "group dp (", "of rank 0", "the mesh says")
    lines.append(f"wrong group: ConfigError {msg}")
    # A mesh of another size than the job.
    expect_config_error(lambda: ndmesh.torch.process_groups(ndmesh.Mesh(dp=8)), "has 8 ranks",
                        "torch.distributed has 4", "--nproc_per_node=8")
    # Bad kinds are the Mesh's ConfigError.
    try:
        ndmesh.torch.process_groups(mesh, "dp,xp")
        raise AssertionError("no ConfigError for the kind 'xp'")
    except ndmesh.ConfigError as e:
        assert "xp" in str(e), e

    # DeviceMesh, where this torch has it.
    reason = ndmesh.torch.device_mesh_unavailable()
    if reason is None:
        mesh = ndmesh.Mesh(dp=2, cp=2, order="cp,dp")
        dm = ndmesh.torch.device_mesh(mesh)
        assert tuple(dm.mesh_dim_names) == ("cp", "dp"), dm.mesh_dim_names
        want = cli_groups(["--dp=2", "--cp=2", "--order=cp,dp"], ["cp", "dp"])
        for name in ("cp", "dp"):
            prove(dm.get_group(name), [g for g in want[name] if rank in g][0], rank, f"DeviceMesh {name}")
        lines.append(f"DeviceMesh {dm.mesh_dim_names}: groups equal `ndmesh mesh --json`'s, all_reduce passes")
    else:
        try:
            ndmesh.torch.device_mesh(mesh)
            raise AssertionError("device_mesh() did not raise where DeviceMesh is unavailable")
        except ndmesh.Error as e:
            assert reason in str(e), e
        lines.append(f"DeviceMesh: SKIPPED: {reason}")

    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"torch {torch.__version__}, {world} ranks, gloo:")
        for line in lines:
            print("  " + line)
        print("PASSED")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        import traceback

        traceback.print_exc()
        print(f"FAIL rank {os.environ.get('RANK')}: {e}", file=sys.stderr)
        sys.exit(1)
