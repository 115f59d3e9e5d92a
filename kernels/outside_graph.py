"""torch.compiler.disable for the kernels' eager paths, without importing torch._dynamo in a process
that never compiles.

torch.compiler.disable imports torch._dynamo (~1.7 s of CPU), so applied at import time it made
every process that imports kernels.flash pay for it: each CLI, each app server, each worker of the
test suite. Nothing can compile before torch._dynamo is imported (torch.compile, torch.export and
set_stance import it first), and until then the plain function is what the disabled one would run.
So outside_graph(fn) returns fn itself while torch._dynamo is not imported, and the moment its
import finishes the module global named for it becomes torch.compiler.disable(fn), before anything
is traced; with torch._dynamo already imported it is disabled at once.

Only for a module-level function the module calls through its global name (the swap rebinds that
name; a reference kept elsewhere keeps the plain function).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading

import torch

__all__ = ["outside_graph"]

_DYNAMO = "torch._dynamo"
_waiting: list[tuple[str, str, object]] = []      # (module, global name, fn) to disable at the import
_lock = threading.Lock()


def outside_graph(fn, name: str | None = None):
    """torch.compiler.disable(fn), applied when torch._dynamo is imported (at once if it is).

    Arguments: fn: a function of the calling module; name: the module global that holds the
        disabled function (default fn.__name__, as for a decorator).
    Returns: fn while torch._dynamo is not imported (the module global is rebound when it is),
        else torch.compiler.disable(fn)."""
    if _DYNAMO in sys.modules:
        return torch.compiler.disable(fn)
    with _lock:
        _waiting.append((fn.__module__, name or fn.__name__, fn))
        if not any(isinstance(f, _WhenDynamoLoads) for f in sys.meta_path):
            sys.meta_path.insert(0, _WhenDynamoLoads())
    return fn


def _disable_waiting() -> None:
    with _lock:
        todo, _waiting[:] = list(_waiting), []
    for module, name, fn in todo:
        setattr(sys.modules[module], name, torch.compiler.disable(fn))


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds torch._dynamo as the other finders do, and disables the waiting functions once its
    module has run (then leaves sys.meta_path)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _DYNAMO:
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenDisable(spec.loader)
        return spec


class _ThenDisable(importlib.abc.Loader):
    """The module's own loader, then _disable_waiting; the module keeps its own loader."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, attr):
        return getattr(self.loader, attr)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        _disable_waiting()
