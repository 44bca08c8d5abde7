"""Publishes PyTorch's own CUDA memory statistics (`torch.cuda.memory_stats()`) for a
`gpumem serve --collect-dir` sidecar, in the format of docs/publish-format.md: for processes that
keep PyTorch's allocator. (With gpumem as the allocator, `gpumem.torch.publish()` publishes
gpumem's richer snapshots instead.)

    import gpumem.publish
    gpumem.publish.start()          # once CUDA is initialised; every second, on a daemon thread

The directory is $GPUMEM_PUBLISH_DIR, else /run/gpumem; the process name $GPUMEM_PROCESS_NAME,
else the script's name.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional

DEFAULT_DIR = "/run/gpumem"
INTERVAL_SECONDS = 1.0

__all__ = ["snapshot", "publish_once", "start", "default_dir"]


def default_dir() -> str:
    return os.environ.get("GPUMEM_PUBLISH_DIR") or DEFAULT_DIR


def _device(torch: Any, index: int, stats: Dict[str, Any]) -> Dict[str, Any]:
    get = stats.get  # missing keys (older PyTorch) become null: "unknown", not exported
    device: Dict[str, Any] = {
        "gpu": index,
        "requested_bytes": get("requested_bytes.all.current"),
        "in_use_bytes": get("allocated_bytes.all.current"),
        "reserved_bytes": get("reserved_bytes.all.current"),
        "in_use_peak_bytes": get("allocated_bytes.all.peak"),
        "reserved_peak_bytes": get("reserved_bytes.all.peak"),
        "allocations_total": get("allocation.all.allocated"),
        "frees_total": get("allocation.all.freed"),
        "live_allocations": get("allocation.all.current"),
        "driver_allocs_total": get("segment.all.allocated"),  # cudaMalloc calls
        "driver_frees_total": get("segment.all.freed"),
        "ooms_total": get("num_ooms"),
        "oom_retries_total": get("num_alloc_retries"),
        "pools": [],
    }
    for pool in ("small", "large"):
        reserved = get(f"reserved_bytes.{pool}_pool.current", 0)
        in_use = get(f"allocated_bytes.{pool}_pool.current", 0)
        device["pools"].append({
            "pool": pool,
            "reserved_bytes": reserved,
            "in_use_bytes": in_use,
            "cached_free_bytes": max(reserved - in_use, 0),
        })
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        device["uuid"] = text if text.startswith("GPU-") else f"GPU-{text}"
    return device


def _process_name() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    return os.environ.get("GPUMEM_PROCESS_NAME") or (
        script if script not in ("", "-", "-c") else "python"
    )


def snapshot(interval: float = INTERVAL_SECONDS) -> Dict[str, Any]:
    """This process's file as a dict: every device it has reserved memory on."""
    import torch

    devices: List[Dict[str, Any]] = []
    if torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(index)
            if stats.get("reserved_bytes.all.peak", 0) > 0:  # a device this process uses
                devices.append(_device(torch, index, stats))
    namespace: Optional[str]
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    return {
        "format": "gpumem.publish",
        "version": 1,
        "pid": os.getpid(),
        "process": _process_name(),
        "pid_namespace": namespace,
        "timestamp_seconds": time.time(),
        "interval_seconds": interval,
        "writer": f"torch {torch.__version__}",
        "devices": devices,
    }


def publish_once(directory: Optional[str] = None, interval: float = INTERVAL_SECONDS) -> str:
    """Writes this process's file atomically (a hidden temporary file, then a rename) and
    returns its path."""
    directory = directory or default_dir()
    path = os.path.join(directory, f"gpumem-{os.getpid()}.json")
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise FileNotFoundError(f"the publish directory {directory} {what}")
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".gpumem-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(snapshot(interval), out)
            os.fchmod(out.fileno(), 0o644)  # mkstemp makes it 0600; the sidecar is another user
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def start(
    directory: Optional[str] = None, interval: float = INTERVAL_SECONDS
) -> Callable[[], None]:
    """Publishes every `interval` seconds on a daemon thread; removes the file at exit.
    Returns a function that stops publishing (and removes the file) at once."""
    directory = directory or default_dir()
    try:
        import torch  # noqa: F401 - what is published is PyTorch's own statistics
    except ImportError as error:
        raise ImportError(
            "gpumem.publish publishes PyTorch's memory statistics, and PyTorch is not "
            "installed (`pip install torch`); with gpumem as the allocator use "
            "gpumem.torch.publish() instead") from error
    os.makedirs(directory, exist_ok=True)
    owner = os.getpid()
    path = os.path.join(directory, f"gpumem-{owner}.json")
    lock, stop = threading.Lock(), threading.Event()

    def loop() -> None:
        while not stop.is_set():
            with lock:  # never write after the file was removed
                if stop.is_set():
                    break
                try:
                    publish_once(directory, interval)
                except Exception as error:  # metrics must never take the engine down
                    print(f"gpumem: could not publish to {directory}: {error}", file=sys.stderr)
            stop.wait(interval)

    def remove() -> None:
        if os.getpid() != owner:
            # A forked child (a data-loader worker leaving through sys.exit runs the exit
            # handlers): the file is the parent's, the lock may have been held at the fork.
            return
        with lock:
            stop.set()
            with contextlib.suppress(OSError):
                os.unlink(path)

    threading.Thread(target=loop, name="gpumem-publish", daemon=True).start()
    atexit.register(remove)
    return remove
