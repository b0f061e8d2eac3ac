"""The examples in the docstrings of the package run: ndmesh (plan, launch_of, the package's
own) and ndmesh.torch (on a one-rank Gloo job; skipped without torch.distributed)."""
import doctest
import unittest

import ndmesh
import ndmesh.torch


def run(module, **globs):
    result = doctest.testmod(module, extraglobs={"ndmesh": ndmesh, **globs}, optionflags=doctest.ELLIPSIS)
    return result


class Doctests(unittest.TestCase):
    def test_package(self):
        result = run(ndmesh)
        self.assertEqual(result.failed, 0)
        self.assertGreaterEqual(result.attempted, 10)

    def test_torch_interop(self):
        try:
            import torch.distributed as dist
        except ImportError:
            self.skipTest("torch is not installed")
        if not dist.is_available():
            self.skipTest("this torch has no torch.distributed")
        try:
            result = run(ndmesh.torch, dist=dist)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        self.assertEqual(result.failed, 0)
        self.assertGreaterEqual(result.attempted, 8)

    def test_every_public_python_call_has_an_example(self):
        for module in (ndmesh, ndmesh.torch):
            for name in module.__all__:
                obj = getattr(module, name)
                if callable(obj) and getattr(obj, "__module__", "").startswith("ndmesh") and \
                        not isinstance(obj, type) and not obj.__module__.endswith("_ndmesh"):
                    with self.subTest(call=f"{module.__name__}.{name}"):
                        self.assertIn(">>>", obj.__doc__ or "")


if __name__ == "__main__":
    unittest.main()
