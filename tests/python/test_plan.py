"""ndmesh.plan and ndmesh.plan_memory return what `ndmesh plan --json` prints: the same
best layout (and the same ranking and numbers) for presets, custom models and options."""
import unittest

import ndmesh
from ndmesh_cli import json_of

# (python kwargs, cli flags)
SEARCHES = [
    (dict(model="llama3-8b", gpus=8, global_batch=64), ["--model", "llama3-8b", "--gpus", 8, "--global-batch", 64]),
    (dict(model="gpt3-175b", gpus=1024, global_batch=1536, hardware="a100-80gb"),
     ["--model", "gpt3-175b", "--gpus", 1024, "--global-batch", 1536, "--hardware", "a100-80gb"]),
    (dict(model="llama3-70b", gpus=512, global_batch=1024, seq=8192, hardware="h200", top=3),
     ["--model", "llama3-70b", "--gpus", 512, "--global-batch", 1024, "--seq", 8192, "--hardware", "h200",
      "--top", 3]),
    (dict(model="gpt3-175b", gpus=512, global_batch=512, attention="standard", top=3),
     ["--model", "gpt3-175b", "--gpus", 512, "--global-batch", 512, "--attention", "standard", "--top", 3]),
    (dict(model={"layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200, "seq": 2048, "mlp": "swiglu"},
          gpus=16, global_batch=128, precision="fp32", no_dropout=True,
          hardware={"preset": "a100-80gb", "gpus_per_node": 4, "gpu_memory_gib": 40}),
     ["--layers", 24, "--hidden", 2048, "--heads", 16, "--vocab", 51200, "--seq", 2048, "--mlp", "swiglu",
      "--gpus", 16, "--global-batch", 128, "--precision", "fp32", "--no-dropout", "--hardware", "a100-80gb",
      "--gpus-per-node", 4, "--gpu-memory-gib", 40]),
]


class Search(unittest.TestCase):
    def test_same_best_layout_as_cli(self):
        for kwargs, flags in SEARCHES:
            with self.subTest(flags=flags):
                want = json_of("plan", *flags)
                got = ndmesh.plan(**kwargs)
                self.assertTrue(got["layouts"], "no layout fits")
                best = {k: got["layouts"][0][k] for k in ("tp", "cp", "pp", "dp", "vpp", "micro_batch", "schedule")}
                self.assertEqual(best, {k: want["layouts"][0][k] for k in best})
                launches = [layout.pop("launch") for layout in got["layouts"]]  # Python's addition
                self.assertEqual(got, want)
                hw = kwargs.get("hardware")
                per_node = hw.get("gpus_per_node", 8) if isinstance(hw, dict) else 8
                for launch, layout in zip(launches, want["layouts"]):
                    self.assertEqual(launch, ndmesh.launch_of(layout, gpus_per_node=per_node, seq=want["seq"],
                                                              global_batch=want["global_batch"]))

    def test_nothing_fits(self):
        got = ndmesh.plan("llama3-405b", gpus=8, global_batch=8)
        want = json_of("plan", "--model", "llama3-405b", "--gpus", 8, "--global-batch", 8, exit_code=1)
        self.assertEqual(got["layouts"], [])
        self.assertEqual(got, want)
        self.assertGreater(got["smallest"]["memory_bytes"]["total"], got["smallest"]["capacity_bytes"])


class Launch(unittest.TestCase):
    """Each layout of ndmesh.plan() carries its torchrun command and torchtitan-style arguments."""

    def test_torchrun_and_torchtitan_arguments(self):
        got = ndmesh.plan("gpt3-175b", gpus=1024, global_batch=1536, hardware="a100-80gb", top=3)
        for layout in got["layouts"]:
            launch = layout["launch"]
            with self.subTest(layout=launch["mesh"]):
                self.assertEqual((launch["nodes"], launch["nproc_per_node"]), (128, 8))
                cmd = launch["torchrun"].split()
                self.assertEqual(cmd[:6], ["torchrun", "--nnodes=128", "--nproc_per_node=8", "--rdzv_backend=c10d",
                                           "--rdzv_endpoint=$MASTER_ADDR:29500", "train.py"])
                self.assertEqual(cmd[6:], launch["args"])
                args = dict(a[2:].split("=", 1) for a in launch["args"])
                dp = int(args["parallelism.data_parallel_replicate_degree"]) * int(
                    args["parallelism.data_parallel_shard_degree"])
                self.assertEqual([dp, int(args["parallelism.pipeline_parallel_degree"]),
                                  int(args["parallelism.context_parallel_degree"]),
                                  int(args["parallelism.tensor_parallel_degree"])],
                                 [layout["dp"], layout["pp"], layout["cp"], layout["tp"]])
                self.assertEqual(args["training.global_batch_size"], "1536")
                self.assertEqual(args["training.seq_len"], str(got["seq"]))
                self.assertEqual(args["activation_checkpoint.mode"], layout["recompute"])
                if layout["pp"] > 1:
                    self.assertIn(args["parallelism.pipeline_parallel_schedule"],
                                  ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"))
                # dims and their order: a mesh of the same ranks, pp outermost, tp innermost
                mesh = ndmesh.Mesh(launch["mesh"])
                self.assertEqual(mesh.names, ["pp", "dp", "cp", "tp"])
                self.assertEqual(mesh.dims, [tuple(d) for d in launch["dims"]])
                self.assertEqual(mesh.world_size, 1024)
                self.assertEqual(mesh.group_size("tp"), layout["tp"])

    def test_one_node_needs_no_rendezvous_endpoint(self):
        layout = ndmesh.plan("llama3-8b", gpus=4, global_batch=16, top=1)["layouts"][0]
        self.assertEqual(layout["launch"]["torchrun"].split(" train.py")[0], "torchrun --nnodes=1 --nproc_per_node=4")

    def test_script_and_gpus_per_node(self):
        got = ndmesh.plan("llama3-8b", gpus=16, global_batch=64, top=1, script="my train.py",
                          hardware={"preset": "h100", "gpus_per_node": 4})
        launch = got["layouts"][0]["launch"]
        self.assertEqual((launch["nodes"], launch["nproc_per_node"]), (4, 4))
        self.assertIn(" 'my train.py' ", launch["torchrun"])


class Memory(unittest.TestCase):
    def test_same_numbers_as_cli(self):
        got = ndmesh.plan_memory("gpt3-175b", tp=8, pp=8, dp=1, micro_batch=1, seq=2048, recompute="full",
                                 schedule="interleaved", vpp=2, global_batch=64, hardware="a100-80gb")
        want = json_of("plan", "memory", "--model", "gpt3-175b", "--tp", 8, "--pp", 8, "--dp", 1,
                       "--micro-batch", 1, "--seq", 2048, "--recompute", "full", "--schedule", "interleaved",
                       "--vpp", 2, "--global-batch", 64, "--hardware", "a100-80gb")
        self.assertEqual(got, want)
        m = got["memory_bytes"]
        self.assertAlmostEqual(m["total"], m["params"] + m["grads"] + m["optimizer"] + m["activations"], delta=1)

    def test_explicit_stage_layers_and_standard_attention(self):
        got = ndmesh.plan_memory("llama3-8b", pp=4, dp=2, micro_batch=1, global_batch=32, attention="standard",
                                 pp_layers="9,8,8,7")
        want = json_of("plan", "memory", "--model", "llama3-8b", "--pp", 4, "--dp", 2, "--micro-batch", 1,
                       "--global-batch", 32, "--attention", "standard", "--pp-layers", "9,8,8,7")
        self.assertEqual(got, want)
        self.assertEqual(got["pp_layers"], [9, 8, 8, 7])
        self.assertEqual(got["attention"], "standard")

    def test_bad_attention(self):
        with self.assertRaisesRegex(ValueError, "attention"):
            ndmesh.plan("llama3-8b", gpus=8, global_batch=64, attention="sparse")

    def test_presets(self):
        self.assertIn("llama3-8b", ndmesh.model_presets())
        self.assertEqual(sorted(ndmesh.hardware_presets()), ["a100-80gb", "h100", "h200"])


if __name__ == "__main__":
    unittest.main()
