"""The examples in the docstrings of the package run: every call of the extension
(ndmesh._ndmesh: functions, Mesh and its methods), ndmesh (plan, launch_of, the package's
own) and ndmesh.torch (on a one-rank Gloo job; skipped without torch.distributed)."""
import doctest
import os
import tempfile
import unittest

import ndmesh
import ndmesh.torch


def run(module, **globs):
    result = doctest.testmod(module, extraglobs={"ndmesh": ndmesh, **globs}, optionflags=doctest.ELLIPSIS)
    return result


def extension_calls():
    """(name, docstring) of every public call of the extension: its functions, the Mesh
    constructor (the class docstring) and Mesh's methods (properties are not calls)."""
    ext = ndmesh._ndmesh
    for name, obj in sorted(vars(ext).items()):
        if name.startswith("_") or isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        if name == "Mesh":
            yield "Mesh", obj.__doc__
            for attr, member in sorted(vars(obj).items()):
                if not attr.startswith("_") and not isinstance(member, property):
                    yield f"Mesh.{attr}", getattr(obj, attr).__doc__
        elif callable(obj) and not isinstance(obj, type):
            yield name, obj.__doc__


class Doctests(unittest.TestCase):
    def test_every_extension_call_has_a_running_example(self):
        parser, calls = doctest.DocTestParser(), 0
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        with tempfile.TemporaryDirectory() as d:  # from_config's example names a missing file
            cwd = os.getcwd()
            os.chdir(d)
            try:
                for name, doc in extension_calls():
                    with self.subTest(call=name):
                        test = parser.get_doctest(doc or "", {"ndmesh": ndmesh}, name, None, 0)
                        self.assertTrue(test.examples, f"ndmesh.{name} has no example in its docstring")
                        result = runner.run(test)
                        self.assertEqual(result.failed, 0, f"the example of ndmesh.{name} fails")
                        calls += 1
            finally:
                os.chdir(cwd)
        self.assertGreaterEqual(calls, 30)

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
