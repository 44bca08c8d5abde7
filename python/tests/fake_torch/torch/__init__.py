"""A stand-in for `torch` in tests without PyTorch: just what gpumem.torch touches, and a way to
allocate through the pluggable allocator the way PyTorch's CUDAPluggableAllocator does."""
__version__ = "0.0+fake"
from . import cuda  # noqa: E402,F401


class _Storage:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


class Tensor:
    """What gpumem.torch wraps: record_stream, and the storage's address."""

    def __init__(self, ptr):
        self.storage = _Storage(ptr)
        self.recorded = []

    def untyped_storage(self):
        return self.storage

    def record_stream(self, stream):
        self.recorded.append(stream)
