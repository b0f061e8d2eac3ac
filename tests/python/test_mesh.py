"""The Python Mesh agrees with the C++ one (`ndmesh mesh --json`) on random shapes and
orders, and with a brute-force layout computed here (row-major, innermost fastest).

NDMESH_TEST_SEED picks the random shapes (default 17); a failure prints the shape.
"""
import itertools
import os
import random
import unittest

import ndmesh
from ndmesh_cli import json_of

SEED = int(os.environ.get("NDMESH_TEST_SEED", "17"))
STANDARD = ["dp", "pp", "cp", "tp", "ep"]


def brute_coords(dims, rank):
    """Mixed-radix digits of rank, outermost dim first."""
    out = []
    for _, size in reversed(dims):
        out.append(rank % size)
        rank //= size
    return list(reversed(out))


def brute_group(dims, rank, chosen):
    """Every rank sharing rank's coordinates outside `chosen`, ascending."""
    world = 1
    for _, s in dims:
        world *= s
    mine = brute_coords(dims, rank)
    keep = [i for i, (n, _) in enumerate(dims) if n not in chosen]
    return [r for r in range(world) if all(brute_coords(dims, r)[i] == mine[i] for i in keep)]


def random_layout(rng):
    """(python Mesh, cli flags, dims outer to inner) for one random layout."""
    style = rng.choice(["order", "megatron", "dims", "default"])
    if style == "dims":
        names = rng.sample(["pipe", "tensor", "data", "expert", "ctx", "x"], rng.randint(1, 5))
        dims = [(n, rng.randint(1, 3)) for n in names]
        text = ",".join(f"{n}={s}" for n, s in dims)
        spec = rng.choice([text, dims, dict(dims)])
        return ndmesh.Mesh(spec), ["--dims", text], dims
    names = rng.sample(STANDARD, rng.randint(1, 5))
    sizes = {n: rng.randint(1, 3) for n in names}
    if style == "default":
        sizes = {n: s for n, s in sizes.items() if n != "ep"}
        order = ["dp", "pp", "cp", "tp"]
        dims = [(n, sizes.get(n, 1)) for n in order]
        flags = [a for n, s in sizes.items() for a in (f"--{n}", s)]
        return ndmesh.Mesh(**sizes), flags, dims
    dims = [(n, sizes[n]) for n in names]
    flags = [a for n, s in sizes.items() for a in (f"--{n}", s)]
    if style == "order":
        order = ",".join(names)
        return ndmesh.Mesh(order=order, **sizes), flags + ["--order", order], dims
    megatron = "-".join(reversed(names))
    return ndmesh.Mesh(megatron_order=megatron, **sizes), flags + ["--megatron-order", megatron], dims


def random_kinds(rng, names):
    kinds = [[n] for n in names]
    for _ in range(3):
        k = rng.sample(names, rng.randint(1, len(names)))
        kinds.append(k)
    return kinds


class RandomShapes(unittest.TestCase):
    def test_random_shapes_match_cli_and_brute_force(self):
        rng = random.Random(SEED)
        for trial in range(30):
            mesh, flags, dims = random_layout(rng)
            names = [n for n, _ in dims]
            kinds = random_kinds(rng, names)
            groups_flag = ",".join("-".join(k) for k in kinds)
            with self.subTest(trial=trial, flags=flags, groups=groups_flag):
                self.assertEqual(mesh.dims, dims)
                rpn = rng.choice([0, 2, 4])
                cli_flags = flags + ["--groups", groups_flag] + (["--ranks-per-node", rpn] if rpn else [])
                want = json_of("mesh", *cli_flags)
                got = mesh.to_dict(groups=groups_flag, ranks_per_node=rpn)
                want.pop("warnings", None)  # the CLI's heavy-dim advice; not a Mesh answer
                self.assertEqual(got, want)

                world = mesh.world_size
                self.assertEqual(world, want["world_size"])
                for rank in rng.sample(range(world), min(world, 3)):
                    view = json_of("mesh", *flags, "--groups", groups_flag, "--rank", rank)
                    self.assertEqual(mesh.view(rank, groups=[k for k in kinds]), view)
                    self.assertEqual(list(mesh.coords(rank).values()), brute_coords(dims, rank))
                    self.assertEqual(mesh.rank(mesh.coords(rank)), rank)
                    for kind in kinds:
                        members = mesh.group(rank, kind)
                        self.assertEqual(members, brute_group(dims, rank, kind))
                        self.assertEqual(members[mesh.key(rank, kind)], rank)
                        self.assertEqual(mesh.groups(kind)[mesh.color(rank, kind)], members)
                        self.assertEqual(mesh.group_size(kind) * mesh.num_groups(kind), world)
                    for name in names:
                        nb = view["neighbours"][name]
                        self.assertEqual(mesh.neighbour(rank, name, -1, edge="line"), nb["prev"])
                        self.assertEqual(mesh.neighbour(rank, name, 1, edge="line"), nb["next"])
                        self.assertEqual(mesh.neighbour(rank, name, -1), nb["ring_prev"])
                        self.assertEqual(mesh.neighbour(rank, name), nb["ring_next"])
                        self.assertEqual(mesh.first(rank, name), nb["first"])
                        self.assertEqual(mesh.last(rank, name), nb["last"])


class Spellings(unittest.TestCase):
    def test_three_spellings_give_one_mesh(self):
        a = ndmesh.Mesh(dp=2, pp=2, cp=2, tp=2, order="pp,dp,cp,tp")
        b = ndmesh.Mesh(dp=2, pp=2, cp=2, tp=2, megatron_order="tp-cp-dp-pp")
        c = ndmesh.Mesh("pp=2,dp=2,cp=2,tp=2")
        self.assertEqual(a, b)
        self.assertEqual(a, c)
        self.assertEqual(str(a), "pp=2,dp=2,cp=2,tp=2")
        self.assertEqual(a.order_string, "tp-cp-dp-pp")
        self.assertEqual(ndmesh.Mesh(str(a)), a)

    def test_seed_004_groups(self):
        m = ndmesh.Mesh("pipe=2,tensor=2,data=4")
        want = json_of("mesh", "--dims", "pipe=2,tensor=2,data=4", "--groups", "pipe,tensor,data,pipe-tensor")
        for kind, groups in want["groups"].items():
            self.assertEqual(m.groups(kind), groups)
        self.assertEqual(m.groups(["tensor", "pipe"]), want["groups"]["pipe-tensor"])
        self.assertEqual(m.key_name("tensor,pipe"), "pipe-tensor")

    def test_world_inference_and_big_mesh(self):
        m = ndmesh.Mesh(tp=8, cp=4, pp=16, dp=-1, world=1048576)
        self.assertEqual(m.size_of("dp"), 2048)
        want = json_of("mesh", "--tp", 8, "--cp", 4, "--pp", 16, "--dp", -1, "--world", 1048576,
                       "--ranks-per-node", 8, "--rank", 777777, "--groups", "tp,cp")
        self.assertEqual(m.view(777777, groups="tp,cp", ranks_per_node=8), want)
        self.assertEqual(ndmesh.Mesh.placement(777777, 8), (want["node"], want["local_rank"]))

    def test_permutation_and_labels(self):
        a = ndmesh.Mesh(tp=2, dp=3)
        b = ndmesh.Mesh(tp=2, dp=3, order="tp,pp,dp,cp")
        perm = ndmesh.Mesh.permutation(a, b)
        for r in range(a.world_size):
            self.assertEqual(b.coords(perm[r]), a.coords(r))
        self.assertEqual(a.group_label(5, "dp"), "dp_group_pp0_cp0_tp1")
        self.assertEqual(len({a, b, ndmesh.Mesh("dp=3,pp=1,cp=1,tp=2")}), 2)

    def test_pickle(self):
        import pickle
        m = ndmesh.Mesh("pipe=2,tensor=3,data=1")
        back = pickle.loads(pickle.dumps(m))
        self.assertEqual(back, m)
        self.assertEqual(back.groups("tensor"), [[0, 1, 2], [3, 4, 5]])


if __name__ == "__main__":
    unittest.main()
