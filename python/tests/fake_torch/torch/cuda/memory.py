"""PyTorch's pluggable-allocator API as it behaves: the library is opened by path, the two
functions looked up by name, and the allocator can be changed only before the first allocation."""
import ctypes

current = None
_allocated = False


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        library = ctypes.CDLL(path_to_so_file)
        self.path = path_to_so_file
        self.alloc = getattr(library, alloc_fn_name)
        self.alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.alloc.restype = ctypes.c_void_p
        self.free = getattr(library, free_fn_name)
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.free.restype = None


def change_current_allocator(allocator):
    global current
    if _allocated:
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator


def allocate(size, stream=None):
    """What a tensor's creation does: the current allocator's alloc_fn on the current device."""
    global _allocated
    _allocated = True
    if current is None:
        return None
    return current.alloc(size, 0, stream)


def free(ptr, size, stream=None):
    current.free(ptr, size, 0, stream)
