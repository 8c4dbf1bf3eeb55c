"""Imported by opguard-autoload.pth only when OPGUARD is set and not 0.

Recording starts when the program imports torch, so processes that never
import torch (tools, launchers' helpers, test runners) load nothing more
than this module.
"""
import importlib.abc
import importlib.util
import sys


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Runs opguard's enable step right after `import torch` finishes."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                import opguard
                opguard._autoload_enable()
            except Exception as e:  # never break `import torch`
                sys.stderr.write(f"opguard-torch warning: autoload failed ({e})\n")

        loader.exec_module = exec_module
        return spec


if "torch" in sys.modules:
    import opguard
    opguard._autoload_enable()
else:
    sys.meta_path.insert(0, _TorchImportHook())
