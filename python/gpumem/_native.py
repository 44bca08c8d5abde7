"""Loads the gpumem C library (the Rust crate's cdylib) with ctypes and declares its functions.

The library is the one shipped inside this package (the wheel puts it at `gpumem/_lib/`), or
the file GPUMEM_LIBRARY names (a build tree's target/release/libgpumem.so, for instance).
PyTorch must load the very same file, so both go through `library_path()`. Nothing here opens
the library before a call needs it: `import gpumem` and `gpumem.publish` work without it.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from typing import Any, NoReturn, Optional

# Where the wheel's build (maturin, module `gpumem._lib`) puts the library, by platform.
_SHIPPED = os.path.join(
    "_lib", {"darwin": "lib_lib.dylib", "win32": "_lib.dll"}.get(sys.platform, "lib_lib.so")
)
_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None


class GpumemError(RuntimeError):
    """A call into the gpumem library failed; the message is the library's own."""


def library_path() -> str:
    """The path of the gpumem library this package uses."""
    override = os.environ.get("GPUMEM_LIBRARY")
    if override:
        path = os.path.abspath(override)
        if not os.path.isfile(path):
            raise GpumemError(f"GPUMEM_LIBRARY names {path}, which does not exist")
        return path
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _SHIPPED)
    if not os.path.isfile(path):
        raise GpumemError(
            f"{path} is missing: this copy of the package has no gpumem library (installed from "
            "the source tree?); install the wheel (`pip install gpumem-allocator`), or point "
            "GPUMEM_LIBRARY at a libgpumem.so built with `cargo build --release -p gpumem-cdylib`"
        )
    return path


class Stat(ctypes.Structure):
    """gpumem_stat_t: one of PyTorch's allocator statistics."""

    _fields_ = [(name, ctypes.c_uint64) for name in ("current", "peak", "allocated", "freed")]


class DeviceStats(ctypes.Structure):
    """gpumem_device_stats_t: each array is all, small pool, large pool."""

    _fields_ = [
        (name, Stat * 3)
        for name in (
            "allocation", "segment", "active", "inactive_split", "allocated_bytes",
            "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
        )
    ] + [
        (name, ctypes.c_uint64)
        for name in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")
    ]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    c_char_p = ctypes.c_char_p
    void_p = ctypes.c_void_p
    owned = ctypes.POINTER(ctypes.c_char)  # strings we must hand back to gpumem_string_free
    stats_p = ctypes.POINTER(DeviceStats)
    signatures = {
        "gpumem_alloc": ([ctypes.c_ssize_t, ctypes.c_int, void_p], void_p),
        "gpumem_free": ([void_p, ctypes.c_ssize_t, ctypes.c_int, void_p], None),
        "gpumem_record_stream": ([void_p, void_p], ctypes.c_int),
        "gpumem_set_tag": ([c_char_p], ctypes.c_int),
        "gpumem_set_default_tag": ([c_char_p], ctypes.c_int),
        "gpumem_empty_cache": ([], ctypes.c_int64),
        "gpumem_reset_peak_stats": ([], ctypes.c_int),
        "gpumem_graph_pool_begin": (
            [ctypes.c_int, void_p, ctypes.c_uint64, ctypes.c_uint64],
            ctypes.c_int,
        ),
        "gpumem_graph_pool_release": (
            [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64],
            ctypes.c_int64,
        ),
        "gpumem_snapshot_json": ([], owned),
        "gpumem_memory_stats_json": ([ctypes.c_int], owned),
        "gpumem_serve": ([c_char_p], ctypes.c_int),
        "gpumem_publish": ([c_char_p], ctypes.c_int),
        "gpumem_alloc_routed": ([ctypes.c_ssize_t, ctypes.c_int, void_p], void_p),
        "gpumem_free_ptr": ([void_p], None),
        "gpumem_device_stats": ([ctypes.c_int, stats_p], ctypes.c_int),
        "gpumem_set_memory_fraction": ([ctypes.c_int, ctypes.c_double], ctypes.c_int),
        "gpumem_memory_fraction": ([ctypes.c_int], ctypes.c_double),
        "gpumem_largest_free_block": ([ctypes.c_int], ctypes.c_int64),
        "gpumem_allocation_size": ([void_p], ctypes.c_int64),
        "gpumem_segments_text": ([ctypes.c_int], owned),
        "gpumem_export_chunks": ([ctypes.c_int, void_p, ctypes.c_uint64], owned),
        "gpumem_oom_message": ([ctypes.c_int, ctypes.c_ssize_t], owned),
        "gpumem_print_errors": ([ctypes.c_int], ctypes.c_int),
        "gpumem_last_error": ([], owned),
        "gpumem_string_free": ([owned], None),
    }
    for name, (arguments, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = arguments
        function.restype = result
    return lib


def _after_fork_in_child() -> None:
    # Only the forking thread lives on in a child; a lock another thread held at the fork would
    # stay held for good. The library itself refuses to allocate in a child (its memory is the
    # parent's): see docs/pytorch.md.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def lib() -> ctypes.CDLL:
    """The loaded library (loaded once per process)."""
    global _library
    with _lock:
        if _library is None:
            _library = _declare(ctypes.CDLL(library_path()))
            # This package raises every failure it reads (GpumemError): the library printing
            # it as well would report it twice. What PyTorch's pluggable allocator calls is
            # still printed, as nothing else would say it.
            _library.gpumem_print_errors(0)
        return _library


def take_string(pointer: Any) -> Optional[str]:
    """Copies a string the library returned and releases it; None for a null pointer."""
    if not pointer:
        return None
    try:
        value: bytes = ctypes.cast(pointer, ctypes.c_char_p).value or b""
        return value.decode("utf-8")
    finally:
        lib().gpumem_string_free(pointer)


def last_error() -> Optional[str]:
    """The library's latest error message, or None."""
    return take_string(lib().gpumem_last_error())


def fail(call: str) -> NoReturn:
    raise GpumemError(last_error() or f"{call} failed")


def encode(text: Optional[object]) -> Optional[bytes]:
    return None if text is None else str(text).encode("utf-8")


def json_call(call: str, *arguments: Any) -> Any:
    """Calls a function returning JSON and decodes it; raises GpumemError on failure."""
    text = take_string(getattr(lib(), call)(*arguments))
    if text is None:
        fail(call)
    return json.loads(text)
