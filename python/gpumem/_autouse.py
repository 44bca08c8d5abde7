"""GPUMEM_TORCH=1: gpumem becomes PyTorch's allocator in a process whose code cannot be edited.

The package installs `gpumem-torch.pth` into site-packages; Python runs it at start-up, and it
imports this module only when GPUMEM_TORCH is set (and not "0"). Importing torch here would slow
every start-up and could run before the program has set up its environment, so this module
waits instead: it calls `gpumem.torch.use()` right after `torch` has finished importing, before
the program can create a tensor. Optional: GPUMEM_TORCH_SERVE=ADDR starts the exporter there,
GPUMEM_TORCH_PUBLISH=DIR publishes snapshots for a sidecar.

A failure is printed as one line on stderr and PyTorch keeps its own allocator: the program runs
as it would have without gpumem.
"""
from __future__ import annotations

import importlib.abc
import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Optional, Sequence


def _report(error: BaseException) -> None:
    print(f"gpumem: GPUMEM_TORCH is set but gpumem could not become PyTorch's allocator: {error}",
          file=sys.stderr)


def _activate() -> None:
    try:
        from . import torch as gpumem_torch

        gpumem_torch.use()
        listen = os.environ.get("GPUMEM_TORCH_SERVE")
        if listen:
            print(f"gpumem: serving on {gpumem_torch.serve(listen)}", file=sys.stderr)
        directory = os.environ.get("GPUMEM_TORCH_PUBLISH")
        if directory:
            gpumem_torch.publish(directory)
    except Exception as error:  # never take the program down for its allocator
        _report(error)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds `torch` the usual way and wraps its loader so `_activate` runs when it is done."""

    def find_spec(
        self,
        name: str,
        path: Optional[Sequence[str]] = None,
        target: Optional[ModuleType] = None,
    ) -> Optional[ModuleSpec]:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once; and so the search below does not find us again
        spec: Optional[ModuleSpec] = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_activate(module: ModuleType) -> None:
            exec_module(module)
            _activate()

        spec.loader.exec_module = exec_then_activate  # type: ignore[method-assign]
        return spec


if "torch" in sys.modules:
    _activate()
else:
    sys.meta_path.insert(0, _AfterTorchImport())
