"""Children forked while threads use gpumem (PyTorch's data-loader workers fork the training
process): run by tests/it/ffi/python.rs with the package's other tests. The forking process is a
fresh interpreter of its own (this file run as a script), so the test runner's threads and locks
are not forked with it.

Each child frees a buffer it inherited (ignored), tags, reads statistics, tries to allocate
(refused: "forked child"), and runs the exit handlers a child leaving through sys.exit() would
(the publisher's must not remove the parent's file); every child must end within the deadline.
"""
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

CHILDREN = 16
THREADS = 4
DEADLINE = 15.0
HOST = "GPUMEM_TEST_FORK_HOST"
HERE = os.path.dirname(os.path.abspath(__file__))


def _busy(thread, stop, lib, gt):
    """Allocates, frees, tags and reads statistics until `stop`, so that at a fork some thread is
    likely inside the library or holding one of the package's locks."""
    live, n = [], 0
    while not stop.is_set():
        with gt.tag(f"worker-{thread}-{n % 20}"):
            size = 512 << (n % 12)
            ptr = lib.gpumem_alloc(size, 0, None)
            live.append((ptr, size))
        if len(live) > 8:
            lib.gpumem_free(*live.pop(0), 0, None)
        if thread == 0 and n % 16 == 0:
            gt.memory_stats(0)
        n += 1
    for ptr, size in live:
        lib.gpumem_free(ptr, size, 0, None)


def _child(inherited, lib, gt, gpumem):
    """What a forked child checks; its exit status is the answer (0: as it should be)."""
    lib.gpumem_free(inherited, 1 << 20, 0, None)
    with gt.tag("child"):
        if lib.gpumem_alloc(4096, 0, None):
            return 2
    from gpumem import _native

    if "forked child" not in (_native.last_error() or ""):
        return 3
    try:
        gt.memory_stats(0)
        return 4
    except gpumem.GpumemError as error:
        if "forked child" not in str(error):
            return 5
    if gt.empty_cache() != 0:
        return 6
    atexit._run_exitfuncs()  # what leaving through sys.exit() would run
    return 0


def host(directory):
    """Forks CHILDREN children while THREADS threads use the library; prints one JSON line."""
    import gpumem
    import gpumem.publish
    import gpumem.torch as gt
    from gpumem import _native

    lib = _native.lib()
    # One publisher busy with its lock at any fork, one that wrote its file once and waits: a
    # child removing that file would show (the first would write its own again at once).
    busy, idle = os.path.join(directory, "busy"), os.path.join(directory, "idle")
    gpumem.publish.start(busy, interval=0.01)
    gpumem.publish.start(idle, interval=3600)
    kept = os.path.join(idle, f"gpumem-{os.getpid()}.json")
    while not os.path.exists(kept):
        time.sleep(0.01)
    inherited = lib.gpumem_alloc(1 << 20, 0, None)
    stop = threading.Event()
    threads = [threading.Thread(target=_busy, args=(n, stop, lib, gt)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    children = []
    for n in range(CHILDREN):
        time.sleep(0.002 + 0.001 * (n % 3))
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(inherited, lib, gt, gpumem)
            finally:
                os._exit(code)
        children.append(pid)
    statuses, hung = [], []
    deadline = time.time() + DEADLINE
    while children and time.time() < deadline:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                statuses.append(os.waitstatus_to_exitcode(status))
                children.remove(pid)
        time.sleep(0.01)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        hung.append(pid)
    stop.set()
    for thread in threads:
        thread.join()
    lib.gpumem_free(inherited, 1 << 20, 0, None)
    print(json.dumps({"statuses": statuses, "hung": len(hung), "file_kept": os.path.exists(kept)}))


class ForkedChildren(unittest.TestCase):
    def test_children_of_a_busy_process_never_block_and_leave_its_file(self):
        fake_torch = os.path.join(HERE, "fake_torch")
        path = os.pathsep.join(p for p in [fake_torch, os.environ.get("PYTHONPATH", "")] if p)
        with tempfile.TemporaryDirectory() as directory:
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), directory],
                env={**os.environ, HOST: "1", "PYTHONPATH": path},
                capture_output=True, text=True, timeout=120,
            )
        self.assertEqual(done.returncode, 0, done.stderr)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"fork host: {report}", file=sys.stderr)
        self.assertEqual(report["hung"], 0, report)
        self.assertEqual(report["statuses"], [0] * CHILDREN, report)
        self.assertTrue(report["file_kept"], "a child removed its parent's published file")


if __name__ == "__main__" and os.environ.get(HOST) == "1":
    host(sys.argv[1])
