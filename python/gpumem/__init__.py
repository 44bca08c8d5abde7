"""gpumem for Python.

- `gpumem.torch`: gpumem's allocator as PyTorch's CUDA allocator (`gpumem.torch.use()`), with
  tags, its own memory statistics, and the exporter (`serve`) or the sidecar publisher
  (`publish`) running inside the process.
- `gpumem.publish`: for processes that keep PyTorch's own allocator, publishes
  `torch.cuda.memory_stats()` for a `gpumem serve --collect-dir` sidecar. It needs no native
  library: nothing here opens it before a call needs it.

Setting GPUMEM_TORCH=1 makes gpumem PyTorch's allocator in any Python process without editing
its code (see `gpumem._autouse`).

The distribution is `gpumem-allocator` (`pip install gpumem-allocator`); the import name is
`gpumem`.
"""
from ._native import GpumemError, library_path

__version__ = "0.1.0"
__all__ = ["GpumemError", "library_path", "__version__"]
