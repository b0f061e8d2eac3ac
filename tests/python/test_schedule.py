"""ndmesh.make_schedule / simulate / svg_timeline agree with `ndmesh schedule --json` and
`--svg`, and with the closed-form bubble of GPipe and 1F1B."""
import os
import tempfile
import unittest

import ndmesh
from ndmesh_cli import json_of, run

CASES = [("gpipe", 4, 8, 0), ("1f1b", 4, 8, 0), ("1f1b", 3, 5, 0), ("interleaved", 4, 8, 2),
         ("interleaved", 2, 4, 3), ("zb-h1", 4, 6, 0)]


class Schedules(unittest.TestCase):
    def test_same_as_cli(self):
        for kind, p, m, v in CASES:
            with self.subTest(schedule=kind, pp=p, microbatches=m, vpp=v):
                s = ndmesh.make_schedule(kind, stages=p, microbatches=m, chunks=v)
                sim = ndmesh.simulate(s, forward=1.0, backward_input=1.5, backward_weight=0.5, p2p=0.1)
                flags = ["--schedule", kind, "--pp", p, "-m", m, "--cost-forward", 1.0, "--cost-backward-input", 1.5,
                         "--cost-backward-weight", 0.5, "--cost-p2p", 0.1] + (["--vpp", v] if v else [])
                want = json_of("schedule", *flags)
                self.assertEqual((s.kind, s.stages, s.microbatches, s.chunks),
                                 (want["schedule"], want["pp"], want["microbatches"], want["vpp"]))
                for key in ("makespan", "bubble_fraction", "busy", "peak_in_flight", "peak_in_flight_chunks"):
                    self.assertEqual(sim[key], want[key], key)
                for stage, (actions, spans, cli) in enumerate(zip(s.actions, sim["spans"], want["actions"])):
                    self.assertEqual(len(actions), len(cli))
                    for a, (start, end), c in zip(actions, spans, cli):
                        self.assertEqual(dict(a, start=start, end=end), c)

    def test_closed_form_bubble(self):
        # unit costs: forward 1, backward 2; GPipe and 1F1B both idle (p-1)/(m+p-1).
        for kind in ("gpipe", "1f1b"):
            for p, m in ((2, 2), (4, 8), (3, 7)):
                sim = ndmesh.simulate(ndmesh.make_schedule(kind, stages=p, microbatches=m))
                self.assertAlmostEqual(sim["makespan"], 3 * (m + p - 1))
                self.assertAlmostEqual(sim["bubble_fraction"], (p - 1) / (m + p - 1))

    def test_svg_same_as_cli(self):
        s = ndmesh.make_schedule("interleaved", stages=4, microbatches=8)
        svg = ndmesh.svg_timeline(s)
        self.assertTrue(svg.lstrip().startswith("<"))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.svg")
            code, _, err = run("schedule", "--schedule", "interleaved", "--pp", 4, "-m", 8, "--svg", path)
            self.assertEqual(code, 0, err)
            with open(path) as f:
                self.assertEqual(svg, f.read())
        self.assertIn("stage 3", ndmesh.ascii_timeline(s))


if __name__ == "__main__":
    unittest.main()
