from . import memory  # noqa: F401

_initialized = False


def is_initialized():
    return _initialized


def current_device():
    return 0


class _Stream:
    cuda_stream = 0


def current_stream(device=None):
    return _Stream()


_handles = 0


def graph_pool_handle():
    global _handles
    _handles += 1
    return (0, _handles)


class CUDAGraph:
    """What gpumem.torch wraps: capture_begin takes an optional pool id, and pool() answers only
    after a capture (as PyTorch's does)."""

    def __init__(self):
        self.began_with = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.began_with = (pool, capture_error_mode)

    def pool(self):
        raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
