"""ndmesh.train() trains in the calling process as `ndmesh train` does: the same losses as
the command's --json for the same options (flags with underscores), the same report, the same
one-line errors as ConfigError."""
import os
import tempfile
import unittest

import json

import ndmesh
from ndmesh_cli import run

SMALL = dict(layers=1, hidden=32, heads=2, kv_heads=1, seq=16, batch=4, markov_vocab=16, threads=1, eval_batches=2)


def cli_report(**options):
    """The last line of `ndmesh train <options as flags> --json`."""
    code, out, err = run("train", *flags(**options), "--json")
    assert code == 0, err
    return json.loads(out.splitlines()[-1])


def flags(**options):
    out = []
    for k, v in options.items():
        out += [f"--{k.replace('_', '-')}"] + ([] if v is True else [v])
    return out


class Train(unittest.TestCase):
    def test_same_losses_as_the_command(self):
        options = dict(SMALL, steps=3, lr_schedule="wsd", warmup=1)
        report = ndmesh.train(**options)
        want = cli_report(**options)
        self.assertEqual(report["steps"], 3)
        self.assertEqual(report["losses"], want["losses"])
        self.assertEqual(report["grad_norms"], want["grad_norms"])
        self.assertEqual(report["lrs"], want["lrs"])
        self.assertEqual(report["final_loss"], want["final_loss"])
        self.assertEqual(set(report), set(want))

    def test_flags_and_files(self):
        with tempfile.TemporaryDirectory() as d:
            metrics = os.path.join(d, "m.jsonl")
            report = ndmesh.train(**SMALL, steps=4, eval_every=2, untied=True, metrics=metrics, zero3_prefetch=False,
                                  val_data=None)
            self.assertEqual(report["eval_steps"], [2, 4])
            with open(metrics) as f:
                self.assertEqual(len(f.readlines()), 4)
            want = cli_report(**SMALL, steps=4, eval_every=2, untied=True)
            self.assertEqual(report["val_losses"], want["val_losses"])

    def test_errors(self):
        with self.assertRaises(ndmesh.ConfigError) as e:
            ndmesh.train(steps=0)
        self.assertEqual(str(e.exception), "[train] --steps=0 must be at least 1; e.g. --steps 1000")
        with self.assertRaises(ndmesh.ConfigError) as e:
            ndmesh.train(stepz=3)
        self.assertIn("ndmesh.train() has no option 'stepz'", str(e.exception))
        with self.assertRaises(ndmesh.ConfigError) as e:
            ndmesh.train(steps="many")
        self.assertIn("--steps=many is not a whole number", str(e.exception))
        with self.assertRaises(ndmesh.ConfigError) as e:
            ndmesh.train(untied="yes")
        self.assertIn("untied='yes' is not True or False", str(e.exception))
        with self.assertRaises(ndmesh.ConfigError) as e:
            ndmesh.train(eval_every=0)
        self.assertIn("--eval-every=0 must be at least 1", str(e.exception))


if __name__ == "__main__":
    unittest.main()
