"""gpumem as PyTorch's CUDA allocator.

    import gpumem.torch
    gpumem.torch.use()                         # before the first CUDA tensor
    gpumem.torch.serve("127.0.0.1:9400")       # /metrics, the status page, the JSON API
    with gpumem.torch.tag("weights"):
        model = build_model().cuda()

With gpumem as the allocator through its PyTorch layer (`_torch_layer`), every `torch.cuda`
memory call answers from gpumem: `memory_stats()`, `max_memory_allocated()`, `empty_cache()`,
`set_per_process_memory_fraction()`, snapshots, CUDA-graph pools, and `OutOfMemoryError` at the
allocating call. Where the layer cannot be built, `use()` falls back to PyTorch's pluggable
interface; the functions of this module then stand in for `torch.cuda`'s, and `use()` wraps
`torch.cuda.CUDAGraph.capture_begin` and `torch.Tensor.record_stream`, which PyTorch does not
forward to a pluggable allocator. Everything except `use()` works without PyTorch too (the C
library is loaded through ctypes).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from . import _native, _torch_layer
from ._native import GpumemError

__all__ = [
    "GpumemError",
    "use",
    "in_use",
    "integration",
    "tag",
    "serve",
    "publish",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "empty_cache",
    "snapshot",
    "build",
]

_state = threading.local()
_use_lock = threading.Lock()
_allocator: Any = None  # torch.cuda.memory.CUDAPluggableAllocator, once use() has run


def _after_fork_in_child() -> None:
    # A lock another thread held at the fork would stay held in the child for good.
    global _use_lock
    _use_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# What names a device: an index, a torch.device, "cuda:1", or None for the current one.
Device = Union[int, str, Any, None]


def use() -> None:
    """Makes gpumem the CUDA allocator of this process. Call it before the first CUDA tensor is
    created (PyTorch cannot swap an allocator that has allocated). Calling it again does nothing.

    gpumem answers PyTorch's whole allocator interface through its PyTorch layer (built once
    for the installed PyTorch: see `gpumem._torch_layer`); where that layer cannot be built,
    one line on stderr says why and gpumem serves allocations through PyTorch's pluggable
    interface, which cannot answer `torch.cuda.memory_stats()` and the like.
    """
    global _allocator
    with _use_lock:
        if _allocator is not None:
            return
        try:
            import torch
            import torch.cuda.memory as memory
        except ImportError as error:
            raise GpumemError(
                "gpumem.torch.use() makes gpumem PyTorch's allocator, and PyTorch is not "
                "installed here (`pip install torch`)"
            ) from error
        library = _native.library_path()
        layer_mode = _torch_layer.mode()
        if layer_mode != "off":
            try:
                _torch_layer.install(torch, library)
                _native.lib()  # the same file, loaded once: both share one manager
                _allocator = _LAYER
                _tag_snapshots(memory)
                return
            except _torch_layer.LayerUnavailable as error:
                if layer_mode == "require":
                    raise GpumemError(f"GPUMEM_TORCH_LAYER=require: {error}") from error
                print(
                    f"gpumem: the PyTorch layer is unavailable ({error}); using PyTorch's "
                    "pluggable-allocator interface, under which torch.cuda.memory_stats(), "
                    "OutOfMemoryError and CUDA-graph pools do not work (docs/pytorch.md)",
                    file=sys.stderr,
                )
            except GpumemError as error:
                raise _refused(error) from error
        allocator = memory.CUDAPluggableAllocator(library, "gpumem_alloc", "gpumem_free")
        try:
            memory.change_current_allocator(allocator)
        except RuntimeError as error:
            raise _refused(error) from error
        _allocator = allocator
        _follow_graph_pools(torch.cuda.CUDAGraph, torch.cuda)
        _follow_record_stream(torch.Tensor)


def _tag_snapshots(memory: Any) -> None:
    """Makes `torch.cuda.memory._snapshot()` (and so `_dump_snapshot`) carry gpumem's tags: each
    live block gpumem knows gets a `gpumem_tag` key, which PyTorch's viewer ignores and a person
    reading the pickle can filter on."""
    if getattr(memory, "_gpumem_tags_snapshots", False):
        return
    take = memory._snapshot

    def snapshot(*args: Any, **kwargs: Any) -> Any:
        document = take(*args, **kwargs)
        try:
            devices = {segment.get("device", 0) for segment in document.get("segments", [])}
            tags: Dict[int, str] = {}
            for device in devices:
                tags.update(tags_by_address(_native.take_string(
                    _native.lib().gpumem_segments_text(device)) or ""))
            annotate_tags(document, tags)
        except Exception:  # noqa: BLE001 - the snapshot itself must never be lost to this
            pass
        return document

    snapshot.__doc__ = take.__doc__
    memory._snapshot = snapshot
    memory._gpumem_tags_snapshots = True


def tags_by_address(segments_text: str) -> Dict[int, str]:
    """Live block address -> tag, from `gpumem_segments_text`'s "B addr size requested
    allocated tag" lines (untagged blocks are left out)."""
    tags: Dict[int, str] = {}
    for line in segments_text.splitlines():
        fields = line.split(" ", 5)
        if len(fields) == 6 and fields[0] == "B" and fields[4] == "1" and fields[5] != "-":
            tags[int(fields[1])] = fields[5]
    return tags


def annotate_tags(document: Dict[str, Any], tags: Dict[int, str]) -> None:
    """Adds `gpumem_tag` to every block of a PyTorch snapshot whose address has a tag."""
    for segment in document.get("segments", []):
        for block in segment.get("blocks", []):
            tag = tags.get(block.get("address", -1))
            if tag is not None:
                block["gpumem_tag"] = tag


# `_allocator` once gpumem answers PyTorch's whole allocator interface through its layer.
_LAYER = "layer"


def _refused(error: BaseException) -> GpumemError:
    return GpumemError(
        "PyTorch has already allocated CUDA memory with its own allocator, so it cannot "
        "switch to gpumem: call gpumem.torch.use() (or set GPUMEM_TORCH=1) before the "
        f"first CUDA tensor is created ({error})"
    )


def build() -> str:
    """Builds gpumem's PyTorch layer for the installed PyTorch now, as `use()` would on first
    use, and returns the built file's path (`python -m gpumem.torch build`, for an image)."""
    try:
        import torch
    except ImportError as error:
        raise GpumemError("building the PyTorch layer needs PyTorch, which is not installed") from error
    return _torch_layer.library_for(torch)


def integration() -> Optional[str]:
    """How gpumem serves PyTorch: "layer" (every torch.cuda memory call answered), "pluggable"
    (allocation and free only), or None before `use()`."""
    if _allocator is None:
        return None
    return "layer" if _allocator is _LAYER else "pluggable"


def _follow_record_stream(tensor_class: Any) -> None:
    """Forwards `Tensor.record_stream(stream)` to gpumem, which PyTorch does not do for a
    pluggable allocator: the tensor's memory, once freed, then waits for the work queued on
    `stream` by then instead of being reused at once on the tensor's own stream."""
    if getattr(tensor_class, "_gpumem_follows_streams", False):
        return
    record = tensor_class.record_stream

    def record_stream(self: Any, stream: Any) -> None:
        record(self, stream)
        ptr = self.untyped_storage().data_ptr()
        if ptr and _native.lib().gpumem_record_stream(ptr, stream.cuda_stream) != 0:
            warnings.warn(
                f"gpumem cannot follow record_stream for this tensor ({_native.last_error()}); "
                "keep it alive until the stream is done with it",
                stacklevel=2,
            )

    record_stream.__doc__ = record.__doc__
    tensor_class.record_stream = record_stream
    tensor_class._gpumem_follows_streams = True


def _follow_graph_pools(graph_class: Any, cuda: Any) -> None:
    """Tells gpumem which memory pool each CUDA graph capture uses and when its graph is gone.

    PyTorch keeps this to itself with a pluggable allocator. gpumem sees a capture on its own
    (allocations on a capturing stream go to a graph pool that stays mapped), but only this
    says which captures share a pool (`torch.cuda.graph(pool=...)`) and when the memory can be
    reused: when the last graph captured into the pool is garbage collected.
    """
    if getattr(graph_class, "_gpumem_follows_pools", False):
        return
    begin = graph_class.capture_begin

    def capture_begin(
        self: Any, pool: Optional[Tuple[int, int]] = None, *args: Any, **kwargs: Any
    ) -> None:
        # A graph's pool id is readable only after its capture: give it one now, as
        # `torch.cuda.graph(pool=torch.cuda.graph_pool_handle())` would.
        if pool is None:
            pool = cuda.graph_pool_handle()
        begin(self, pool, *args, **kwargs)
        device = cuda.current_device()
        stream = cuda.current_stream(device).cuda_stream
        high, low = pool
        if _native.lib().gpumem_graph_pool_begin(device, stream, high, low) != 0:
            warnings.warn(
                f"gpumem could not follow this graph's memory pool ({_native.last_error()}); "
                "its allocations are kept until the process ends",
                stacklevel=2,
            )
            return
        weakref.finalize(self, _release_graph_pool, device, high, low)

    capture_begin.__doc__ = begin.__doc__
    graph_class.capture_begin = capture_begin
    graph_class._gpumem_follows_pools = True


def _release_graph_pool(device: int, high: int, low: int) -> None:
    # Runs when a graph is collected, possibly as the interpreter shuts down: never raises.
    try:
        _native.lib().gpumem_graph_pool_release(device, high, low)
    except Exception:  # noqa: BLE001 - a finalizer has nobody to report to
        pass


def in_use() -> bool:
    """Whether `use()` made gpumem PyTorch's allocator in this process."""
    return _allocator is not None


def _tag_stack() -> List[Optional[bytes]]:
    stack: Optional[List[Optional[bytes]]] = getattr(_state, "tags", None)
    if stack is None:
        stack = _state.tags = []
    return stack


@contextlib.contextmanager
def tag(name: str, all_threads: bool = False) -> Iterator[None]:
    """Allocations made inside carry `name` (`weights`, `kv_cache`, `activations`, ...) in the
    leak tracker, the status page and `/metrics`. Tags nest; the innermost wins.

    A tag belongs to the thread that sets it. PyTorch's backward pass runs on threads of its
    own: `all_threads=True` tags the allocations of every thread that has no tag of its own.
    """
    encoded = _native.encode(name)
    if all_threads:
        setter, stack = _native.lib().gpumem_set_default_tag, _default_tags
    else:
        setter, stack = _native.lib().gpumem_set_tag, _tag_stack()
    if setter(encoded) != 0:
        _native.fail("tag")
    stack.append(encoded)
    try:
        yield
    finally:
        stack.pop()
        setter(stack[-1] if stack else None)


_default_tags: List[Optional[bytes]] = []


def serve(listen: str = "127.0.0.1:9400") -> str:
    """Serves `/metrics`, the status page and the JSON API (the same as `gpumem demo`) from a
    thread of this process; returns the status page's URL. Port 0 picks a free port. Calling it
    again returns the running exporter's URL."""
    port: int = _native.lib().gpumem_serve(_native.encode(listen))
    if port < 0:
        _native.fail("serve")
    host = str(listen).rsplit(":", 1)[0] if listen else "127.0.0.1"
    if host in ("0.0.0.0", "[::]", ""):
        host = "127.0.0.1"
    return f"http://{host}:{port}/"


def publish(directory: Optional[str] = None) -> None:
    """Writes this process's snapshots into `directory` every second for a
    `gpumem serve --collect-dir` sidecar (default: $GPUMEM_PUBLISH_DIR, else /run/gpumem).

    Out-of-memory flight records go into `<directory>/oom`; with gpumem as PyTorch's allocator
    (through its layer), PyTorch's own snapshot of each refusal goes beside them
    (`gpumem.oom_snapshots`)."""
    if _native.lib().gpumem_publish(_native.encode(directory)) != 0:
        _native.fail("publish")
    if _allocator is _LAYER:
        import torch

        from . import oom_snapshots
        from .publish import default_dir

        oom_snapshots.attach(torch, os.path.join(directory or default_dir(), "oom"))


def _device_index(device: Device) -> int:
    if device is None:
        try:
            import torch

            if torch.cuda.is_initialized():
                current: int = torch.cuda.current_device()
                return current
        except ImportError:
            pass
        return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)  # torch.device("cuda:1")
    if isinstance(index, int):
        return index
    text = str(device)
    return int(text.split(":", 1)[1]) if ":" in text else 0


def memory_stats(device: Device = None) -> Dict[str, Any]:
    """gpumem's statistics for `device` under the keys of `torch.cuda.memory_stats()`
    (`allocated_bytes.all.current`, `reserved_bytes.all.peak`, `num_ooms`, ...)."""
    stats: Dict[str, Any] = _native.json_call("gpumem_memory_stats_json", _device_index(device))
    return stats


def memory_allocated(device: Device = None) -> int:
    return int(memory_stats(device)["allocated_bytes.all.current"])


def max_memory_allocated(device: Device = None) -> int:
    return int(memory_stats(device)["allocated_bytes.all.peak"])


def memory_reserved(device: Device = None) -> int:
    return int(memory_stats(device)["reserved_bytes.all.current"])


def max_memory_reserved(device: Device = None) -> int:
    return int(memory_stats(device)["reserved_bytes.all.peak"])


def reset_peak_memory_stats() -> None:
    if _native.lib().gpumem_reset_peak_stats() != 0:
        _native.fail("reset_peak_memory_stats")


def empty_cache() -> int:
    """Returns cached memory no tensor uses to the driver; the number of bytes released."""
    released: int = _native.lib().gpumem_empty_cache()
    if released < 0:
        _native.fail("empty_cache")
    return released


def snapshot() -> Dict[str, Any]:
    """The manager's snapshot: the document `/api/v1/snapshot` serves, as a dict."""
    document: Dict[str, Any] = _native.json_call("gpumem_snapshot_json")
    return document


def _main(arguments: List[str]) -> int:
    if arguments != ["build"]:
        print("usage: python -m gpumem.torch build   (builds the PyTorch layer for the installed "
              "PyTorch into the cache, as the first gpumem.torch.use() would)", file=sys.stderr)
        return 2
    try:
        print(build())
    except GpumemError as error:
        print(f"gpumem: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
