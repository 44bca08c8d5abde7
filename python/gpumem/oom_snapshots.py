"""PyTorch memory snapshots beside the out-of-memory flight records of a publishing process.

With gpumem as PyTorch's allocator and `gpumem.torch.publish(directory)` on, the library writes
each out-of-memory flight record (JSON: gpumem's devices, pools and history) into
`<directory>/oom`, where a sidecar or node agent lists it. This module adds the view PyTorch's
own tools read: at the refusal, an out-of-memory observer takes `torch.cuda.memory._snapshot()`
(segments, blocks and, while `_record_memory_history` is on, the trace with stacks) and writes
it as a pickle, the format `torch.cuda.memory._dump_snapshot` writes and PyTorch's memory
viewer opens, under the record's naming: `<UTC stamp>-oom-gpu<N>-pid<P>.pickle` (the pid keeps
two processes on one GPU from writing the same name in the same millisecond).

The observer runs on the allocating thread, inside the failing call, before the exception is
raised, which is the only moment the blocks that did not fit are still there. It is bounded the
way the records are: at most one snapshot per device every `min_gap` seconds (a loop of refusals
writes one), at most `max_files` snapshots and `max_bytes` together in the directory (the
oldest go first; a snapshot with history can take tens of MiB). A snapshot that cannot be taken
or written costs one line on stderr, never the OutOfMemoryError the program is about to catch.
"""
from __future__ import annotations

import os
import pickle
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

MAX_FILES = 5
MAX_BYTES = 256 << 20
MIN_GAP_SECONDS = 10.0
SUFFIX = ".pickle"

__all__ = ["OomSnapshots", "attach", "utc_stamp"]


def utc_stamp(unix_seconds: float) -> str:
    """`20250102T030405.678Z`, as the flight records are named: UTC, sorts as it reads."""
    millis = int(max(unix_seconds, 0.0) * 1000)
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(millis // 1000)) + f".{millis % 1000:03d}Z"


def is_snapshot_name(name: str) -> bool:
    """A snapshot this module wrote (or another process's, in the same directory)."""
    return name.endswith(SUFFIX) and name[:1].isdigit() and "-oom-gpu" in name


class OomSnapshots:
    """An out-of-memory observer (PyTorch calls it with the device, the bytes allocated on it,
    its total and its free bytes) that writes `take()`'s document into `directory`."""

    def __init__(
        self,
        directory: str,
        take: Callable[[], Any],
        max_files: int = MAX_FILES,
        max_bytes: int = MAX_BYTES,
        min_gap: float = MIN_GAP_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.take = take
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.min_gap = min_gap
        self.clock = clock
        self.written: List[str] = []
        self._last: Dict[int, float] = {}
        self._lock = threading.Lock()

    def __call__(self, device: int, allocated: int = 0, total: int = 0, free: int = 0) -> None:
        now = self.clock()
        with self._lock:
            last = self._last.get(device)
            if last is not None and now - last < self.min_gap:
                return
            self._last[device] = now
        try:
            self.written.append(self.write(device, now))
        except Exception as error:  # noqa: BLE001 - the program is about to catch the OOM itself
            print(f"gpumem: could not write the PyTorch snapshot of an out-of-memory refusal into "
                  f"{self.directory}: {error}", file=sys.stderr)

    def write(self, device: int, now: float) -> str:
        """Writes one snapshot atomically (a temporary file renamed into place, so a reader
        never opens half of one) after making room for it. Returns its path."""
        data = pickle.dumps(self.take())
        os.makedirs(self.directory, exist_ok=True)
        self.prune(self.max_files - 1, self.max_bytes - len(data))
        name = f"{utc_stamp(now)}-oom-gpu{device}-pid{os.getpid()}{SUFFIX}"
        path = os.path.join(self.directory, name)
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".gpumem-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temporary, path)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        return path

    def listing(self) -> List[Tuple[str, int]]:
        """The snapshots in the directory, oldest first, with their sizes."""
        found = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            if not is_snapshot_name(name):
                continue
            try:
                found.append((name, os.stat(os.path.join(self.directory, name)).st_size))
            except OSError:
                pass
        return sorted(found)

    def prune(self, max_files: int, max_bytes: int) -> None:
        """Removes the oldest snapshots until at most `max_files` are left, holding at most
        `max_bytes` together; one that cannot be removed is skipped."""
        files = self.listing()
        count, total = len(files), sum(size for _, size in files)
        for name, size in files:
            if count <= max_files and total <= max_bytes:
                return
            try:
                os.unlink(os.path.join(self.directory, name))
                count, total = count - 1, total - size
            except OSError:
                pass


_attached: Dict[str, OomSnapshots] = {}
_attach_lock = threading.Lock()


def attach(torch: Any, directory: str) -> OomSnapshots:
    """Registers the observer with PyTorch's allocator for `directory` (once per directory)."""
    directory = os.path.abspath(directory)
    with _attach_lock:
        observer = _attached.get(directory)
        if observer is None:
            observer = OomSnapshots(directory, lambda: torch.cuda.memory._snapshot())
            torch._C._cuda_attach_out_of_memory_observer(observer)
            _attached[directory] = observer
        return observer
