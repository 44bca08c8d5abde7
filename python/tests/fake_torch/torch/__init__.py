"""A stand-in for `torch` in tests without PyTorch: just what gpumem.torch touches, and a way to
allocate through the pluggable allocator the way PyTorch's CUDAPluggableAllocator does."""
__version__ = "0.0+fake"
from . import cuda  # noqa: E402,F401
