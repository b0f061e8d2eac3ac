"""Bad input raises the exception of the right Python type carrying the very message the
`ndmesh` command prints (stderr 'ndmesh: <message>', exit code 2)."""
import os
import tempfile
import unittest

import ndmesh
from ndmesh_cli import error_of


class Hierarchy(unittest.TestCase):
    def test_types(self):
        self.assertTrue(issubclass(ndmesh.Error, RuntimeError))
        self.assertTrue(issubclass(ndmesh.ConfigError, ValueError))
        self.assertTrue(issubclass(ndmesh.ConfigError, ndmesh.Error))
        self.assertTrue(issubclass(ndmesh.IoError, OSError))
        self.assertTrue(issubclass(ndmesh.IoError, ndmesh.Error))
        self.assertTrue(issubclass(ndmesh.InternalError, ndmesh.Error))
        self.assertFalse(issubclass(ndmesh.InternalError, ValueError))
        self.assertFalse(issubclass(ndmesh.Error, ValueError))

    def test_unknown_keyword_is_a_type_error(self):
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'xp'"):
            ndmesh.Mesh(xp=2)


class SameMessagesAsTheCli(unittest.TestCase):
    def check(self, call, *cli_args, type_=ndmesh.ConfigError, component="config"):
        want = error_of(*cli_args)
        with self.assertRaises(type_) as ctx:
            call()
        self.assertEqual(str(ctx.exception), want)
        self.assertEqual(ctx.exception.component, component)
        return ctx.exception

    def test_layouts(self):
        e = self.check(lambda: ndmesh.Mesh(tp=0), "mesh", "--tp", 0)
        self.assertIsInstance(e, ValueError)
        self.check(lambda: ndmesh.Mesh(tp=2, order="dp,pp,cp"), "mesh", "--tp", 2, "--order", "dp,pp,cp")
        self.check(lambda: ndmesh.Mesh(order="dp,pp,xx"), "mesh", "--order", "dp,pp,xx")
        self.check(lambda: ndmesh.Mesh(megatron_order="tp-tp"), "mesh", "--megatron-order", "tp-tp")
        self.check(lambda: ndmesh.Mesh(tp=3, dp=-1, world=8), "mesh", "--tp", 3, "--dp", -1, "--world", 8)
        self.check(lambda: ndmesh.Mesh(tp=2, world=8), "mesh", "--tp", 2, "--world", 8)
        self.check(lambda: ndmesh.Mesh(world=0), "mesh", "--world", 0)
        self.check(lambda: ndmesh.Mesh("a=2,a=3"), "mesh", "--dims", "a=2,a=3", component="mesh")
        self.check(lambda: ndmesh.Mesh("a=x"), "mesh", "--dims", "a=x", component="mesh")
        self.check(lambda: ndmesh.Mesh("a=0"), "mesh", "--dims", "a=0", component="mesh")
        self.check(lambda: ndmesh.Mesh(tp=2, dims="a=2"), "mesh", "--tp", 2, "--dims", "a=2")

    def test_queries(self):
        m = ndmesh.Mesh(tp=2, dp=2)
        self.check(lambda: m.coords(4), "mesh", "--tp", 2, "--dp", 2, "--rank", 4, component="mesh")
        self.check(lambda: m.group(0, "xx"), "mesh", "--tp", 2, "--dp", 2, "--groups", "xx", component="mesh")
        self.check(lambda: m.groups("tp-tp"), "mesh", "--tp", 2, "--dp", 2, "--groups", "tp-tp", component="mesh")
        with self.assertRaises(ndmesh.ConfigError):
            m.neighbour(0, "tp", edge="loop")

    def test_config_file(self):
        toml = ("[parallel]\ntp = 8\npp = 4\ndp = 2\n[model]\nlayers = 30\nhidden = 1536\nheads = 12\n"
                "seq = 2048\nvocab = 50257\n[training]\nmicro_batch = 1\nglobal_batch = 7\n")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.toml")
            with open(path, "w") as f:
                f.write(toml)
            e = self.check(lambda: ndmesh.Mesh.from_config(path), "mesh", "--config", path)
            self.assertIn("2 problems", str(e))  # the batch over dp, the heads over tp (the vocabulary is padded)
            missing = os.path.join(d, "missing.toml")
            # A path the user names that does not exist is bad input (exit 2 in the CLI too).
            error_of("mesh", "--config", missing)
            with self.assertRaises(ndmesh.ConfigError) as ctx:
                ndmesh.Mesh.from_config(missing)
            self.assertEqual(str(ctx.exception), f"[config] config file '{missing}' does not exist; check the path")

    def test_validation(self):
        m = ndmesh.Mesh(tp=8, pp=4, dp=2)
        # The rules ndmesh train runs by: batch over dp, heads over tp (any vocabulary: it is padded).
        model = {"layers": 30, "hidden": 1536, "heads": 12, "seq": 2048, "vocab": 50257}
        problems = ndmesh.problems(m, model=model, micro_batch=1, global_batch=7)
        self.assertEqual(len(problems), 2)
        with self.assertRaises(ndmesh.ConfigError) as ctx:
            ndmesh.validate(m, model=model, micro_batch=1, global_batch=7)
        self.assertEqual(str(ctx.exception).splitlines()[1:], [f"  - {p}" for p in problems])
        self.assertEqual(ndmesh.problems(m, model=dict(model, heads=16, vocab=50304), global_batch=8), [])

    def test_plan(self):
        self.check(lambda: ndmesh.plan("llama3-7b", gpus=8, global_batch=8),
                   "plan", "--model", "llama3-7b", "--gpus", 8, "--global-batch", 8, component="plan")
        self.check(lambda: ndmesh.plan("llama3-8b", gpus=0, global_batch=8),
                   "plan", "--model", "llama3-8b", "--gpus", 0, "--global-batch", 8, component="plan")
        self.check(lambda: ndmesh.plan("llama3-8b", gpus=8, global_batch=8, hardware="h300"),
                   "plan", "--model", "llama3-8b", "--gpus", 8, "--global-batch", 8, "--hardware", "h300",
                   component="plan")
        self.check(lambda: ndmesh.plan("llama3-8b", gpus=8, global_batch=8, precision="fp8"),
                   "plan", "--model", "llama3-8b", "--gpus", 8, "--global-batch", 8, "--precision", "fp8",
                   component="plan")
        self.check(lambda: ndmesh.plan_memory("gpt3-1.7b", tp=5),
                   "plan", "memory", "--model", "gpt3-1.7b", "--tp", 5, component="plan")

    def test_schedules(self):
        self.check(lambda: ndmesh.make_schedule("interleaved", stages=4, microbatches=6),
                   "schedule", "--schedule", "interleaved", "--pp", 4, "-m", 6, component="pp")
        self.check(lambda: ndmesh.make_schedule("1f1b", stages=0, microbatches=6),
                   "schedule", "--pp", 0, "-m", 6, component="pp")
        s = ndmesh.make_schedule("1f1b", stages=2, microbatches=2)
        self.check(lambda: ndmesh.simulate(s, forward=-1),
                   "schedule", "--pp", 2, "-m", 2, "--cost-forward", -1, component="pp")


if __name__ == "__main__":
    unittest.main()
