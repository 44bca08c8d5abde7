"""The C library through ctypes, on the simulated device, without PyTorch: run by
tests/it/ffi/python.rs (`cargo test`) twice, against the source tree and against the wheel
installed in a virtual environment (TEST_GPUMEM_INSTALLED=1 there), or by hand with

    GPUMEM_LIBRARY=target/release/libgpumem.so PYTHONPATH=python python3 -m unittest discover -s python/tests
"""
import ctypes
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import unittest
import urllib.request

# The simulated device, unless the caller chose otherwise; read by the library's first call.
os.environ.setdefault("GPUMEM_BACKEND", "sim")
os.environ.setdefault("GPUMEM_SIM_MEMORY", "4GiB")

import gpumem  # noqa: E402
import gpumem.torch as gt  # noqa: E402
from gpumem import _native  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory holding the `gpumem` package under test: python/ of the source tree, or
# site-packages where the wheel is installed.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpumem.__file__)))
INSTALLED = os.environ.get("TEST_GPUMEM_INSTALLED") == "1"
# Installed, site-packages runs the wheel's .pth at start-up by itself; from the source tree the
# child processes add the directory the wheel takes it from.
PTH_DIR = os.path.join(PACKAGE_ROOT, "wheel-data", "purelib")
ADD_PTH = "" if INSTALLED else f"import site\nsite.addsitedir({PTH_DIR!r})\n"
FAKE_TORCH = os.path.join(HERE, "fake_torch")
MIB = 1 << 20
LOCK = threading.Lock()  # the tests share one process-wide manager


def alloc(size, stream=None, device=0):
    return _native.lib().gpumem_alloc(size, device, stream)


def free(ptr, size, stream=None, device=0):
    _native.lib().gpumem_free(ptr, size, device, stream)


class NativeAbi(unittest.TestCase):
    def setUp(self):
        LOCK.acquire()
        self.addCleanup(LOCK.release)

    def test_alloc_and_free_move_the_statistics(self):
        before = gt.memory_stats(0)
        ptr = alloc(3 * MIB + 5)
        self.assertTrue(ptr, _native.last_error())
        self.assertEqual(ptr % 512, 0, "PyTorch's alignment")
        during = gt.memory_stats(0)
        self.assertGreaterEqual(
            during["allocated_bytes.all.current"] - before["allocated_bytes.all.current"], 3 * MIB + 5
        )
        self.assertEqual(during["allocation.all.current"], before["allocation.all.current"] + 1)
        self.assertGreaterEqual(during["reserved_bytes.all.current"], during["allocated_bytes.all.current"])
        free(ptr, 3 * MIB + 5)
        after = gt.memory_stats(0)
        self.assertEqual(after["allocated_bytes.all.current"], before["allocated_bytes.all.current"])
        self.assertEqual(after["allocation.all.freed"], before["allocation.all.freed"] + 1)
        self.assertGreaterEqual(gt.max_memory_allocated(0), 3 * MIB)

    def test_size_zero_is_null_without_an_error(self):
        marker = "no error yet"
        _native.lib().gpumem_set_tag(b"\xff")  # leaves a known latest error
        marker = _native.last_error()
        self.assertIsNone(alloc(0))
        self.assertEqual(_native.last_error(), marker)
        free(None, 0)  # freeing null is allowed, like free(NULL)
        self.assertEqual(_native.last_error(), marker)

    def test_bad_requests_return_null_and_say_why(self):
        self.assertIsNone(alloc(-1))
        self.assertIn("negative", _native.last_error())
        self.assertIsNone(alloc(MIB, device=7))
        self.assertIn("device", _native.last_error())
        self.assertIsNone(alloc(64 << 30))  # more than the 4 GiB device
        self.assertIn("gpumem_alloc", _native.last_error())
        self.assertGreaterEqual(gt.memory_stats(0)["num_ooms"], 0)

    def test_freeing_a_foreign_or_freed_pointer_is_reported_not_fatal(self):
        free(0xDEAD000, 16)
        self.assertIn("not allocated by gpumem_alloc", _native.last_error())
        ptr = alloc(MIB)
        free(ptr, MIB)
        free(ptr, MIB)
        self.assertIn("freed already", _native.last_error())

    def test_a_free_that_disagrees_with_the_allocation_frees_and_says_so(self):
        ptr = alloc(MIB)
        free(ptr, 2 * MIB)
        self.assertIn("allocated as 1048576 bytes", _native.last_error())
        free(ptr, MIB)
        self.assertIn("freed already", _native.last_error())

    def test_memory_freed_on_a_stream_is_reused_there_at_once_and_not_on_another(self):
        stream_a, stream_b = 0x1000, 0x2000
        first = alloc(8 * MIB, stream_a)
        free(first, 8 * MIB, stream_a)
        again = alloc(8 * MIB, stream_a)
        self.assertEqual(again, first, "the same stream reuses the block at once")
        other = alloc(8 * MIB, stream_b)
        self.assertNotEqual(other, again)
        free(again, 8 * MIB, stream_a)
        elsewhere = alloc(8 * MIB, stream_b)
        self.assertNotEqual(elsewhere, first, "another stream must not get memory stream A may still use")
        free(other, 8 * MIB, stream_b)
        free(elsewhere, 8 * MIB, stream_b)

    def test_tags_reach_the_snapshot_and_nest(self):
        with gt.tag("kv_cache"):
            kv = alloc(6 * MIB)
            with gt.tag("activations"):
                act = alloc(2 * MIB)
            kv2 = alloc(MIB)
        untagged = alloc(MIB)
        try:
            tags = {}
            for device in gt.snapshot()["devices"]:
                for group in device["by_tag"]:
                    tags[group["tag"]] = group["bytes"]
            self.assertGreaterEqual(tags.get("kv_cache", 0), 7 * MIB, tags)
            self.assertGreaterEqual(tags.get("activations", 0), 2 * MIB, tags)
            self.assertIn("untagged", tags)
        finally:
            for ptr, size in ((kv, 6 * MIB), (act, 2 * MIB), (kv2, MIB), (untagged, MIB)):
                free(ptr, size)

    def test_a_tag_for_all_threads_reaches_threads_without_their_own(self):
        seen = []
        with gt.tag("gradients", all_threads=True):
            worker = threading.Thread(target=lambda: seen.append(alloc(3 * MIB)))
            worker.start()
            worker.join()
        try:
            groups = [g for d in gt.snapshot()["devices"] for g in d["by_tag"]]
            self.assertIn("gradients", [g["tag"] for g in groups])
        finally:
            free(seen[0], 3 * MIB)

    def test_a_tag_that_is_not_utf8_is_refused(self):
        self.assertEqual(_native.lib().gpumem_set_tag(b"\xff\xfe"), -1)
        self.assertIn("UTF-8", _native.last_error())

    def test_empty_cache_returns_idle_pages(self):
        ptrs = [alloc(16 * MIB) for _ in range(4)]
        for ptr in ptrs:
            free(ptr, 16 * MIB)
        reserved = gt.memory_reserved(0)
        released = gt.empty_cache()
        self.assertGreater(released, 0)
        self.assertEqual(gt.memory_reserved(0), reserved - released)

    def test_reset_peak_memory_stats(self):
        ptr = alloc(32 * MIB)
        free(ptr, 32 * MIB)
        gt.reset_peak_memory_stats()
        self.assertLess(gt.max_memory_allocated(0), 32 * MIB)

    def test_threads_allocating_at_once_leave_nothing_behind(self):
        before = gt.memory_stats(0)["allocation.all.current"]
        errors = []

        def work(seed):
            live = []
            for i in range(400):
                size = 512 * (1 + (seed * 7919 + i * 104729) % 4096)
                ptr = alloc(size, 0x3000 if seed % 2 else None)
                if not ptr:
                    errors.append(_native.last_error())
                    return
                live.append((ptr, size, 0x3000 if seed % 2 else None))
                if len(live) > 16:
                    p, s, st = live.pop(0)
                    free(p, s, st)
            for p, s, st in live:
                free(p, s, st)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        stats = gt.memory_stats(0)
        self.assertEqual(stats["allocation.all.current"], before)
        self.assertEqual(stats["ffi_live_allocations"], before)


class SnapshotTags(unittest.TestCase):
    """gpumem's tags carried into PyTorch's snapshot: its blocks named by the C ABI's segment
    text, read from a real allocation on the simulated device."""

    def test_tagged_blocks_get_their_tag_and_others_none(self):
        with gt.tag("kv_cache"):
            tagged = _native.lib().gpumem_alloc(3 << 20, 0, None)
        plain = _native.lib().gpumem_alloc(1 << 20, 0, None)
        try:
            text = _native.take_string(_native.lib().gpumem_segments_text(0)) or ""
            tags = gt.tags_by_address(text)
            self.assertEqual(tags.get(tagged), "kv_cache", text)
            self.assertNotIn(plain, tags)
            document = {"segments": [{"device": 0, "blocks": [
                {"address": tagged, "size": 3 << 20, "state": "active_allocated"},
                {"address": plain, "size": 1 << 20, "state": "active_allocated"},
            ]}]}
            gt.annotate_tags(document, tags)
            blocks = document["segments"][0]["blocks"]
            self.assertEqual(blocks[0]["gpumem_tag"], "kv_cache")
            self.assertNotIn("gpumem_tag", blocks[1])
        finally:
            _native.lib().gpumem_free(tagged, 3 << 20, 0, None)
            _native.lib().gpumem_free(plain, 1 << 20, 0, None)


class Exporter(unittest.TestCase):
    def test_serve_answers_metrics_and_the_snapshot(self):
        with LOCK:
            with gt.tag("weights"):
                ptr = alloc(4 * MIB)
            url = gt.serve("127.0.0.1:0")
            self.assertEqual(gt.serve("127.0.0.1:0"), url, "a second call returns the running one")
            try:
                metrics = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
                self.assertIn("gpumem_in_use_bytes", metrics)
                snapshot = json.loads(urllib.request.urlopen(url + "api/v1/snapshot", timeout=10).read())
                self.assertEqual(snapshot["backend"], "sim")
                page = urllib.request.urlopen(url, timeout=10).read().decode()
                deadline = time.time() + 10
                while "weights" not in page and time.time() < deadline:  # the next sample
                    time.sleep(0.2)
                    page = urllib.request.urlopen(url, timeout=10).read().decode()
                self.assertIn("weights", page)
            finally:
                free(ptr, 4 * MIB)

    def test_serve_refuses_a_bad_address(self):
        with self.assertRaises(gpumem.GpumemError) as raised:
            _native.lib().gpumem_serve(b"not-an-address") >= 0 or _native.fail("serve")
        self.assertIn("not-an-address", str(raised.exception))

    def test_publish_writes_this_process_file(self):
        with tempfile.TemporaryDirectory() as directory:
            gt.publish(directory)
            path = os.path.join(directory, f"gpumem-{os.getpid()}.json")
            deadline = time.time() + 10
            while not os.path.exists(path) and time.time() < deadline:
                time.sleep(0.05)
            with open(path) as published:
                document = json.load(published)
            self.assertEqual(document["format"], "gpumem.publish")
            self.assertEqual(document["pid"], os.getpid())
            with self.assertRaises(gpumem.GpumemError):
                gt.publish(directory)  # one publisher per process


def run_python(code, env):
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def catching_warnings(setup, body, after):
    """Python source: `setup`, then `body` (lines) with every warning recorded in `caught`, then
    `after`, which may read `caught`."""
    indented = "".join("    " + line + "\n" for line in body)
    return (setup + "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n" + indented + after)


class UseWithPyTorchsApi(unittest.TestCase):
    """`use()` and GPUMEM_TORCH=1 against a stand-in torch that calls the library as PyTorch does."""

    ALLOCATE = (
        "import torch.cuda.memory as m\n"
        "ptr = m.allocate(1 << 20)\n"
        "assert ptr, 'allocation through the pluggable allocator failed'\n"
        "import gpumem.torch as gt\n"
        "assert gt.memory_allocated(0) >= 1 << 20, gt.memory_stats(0)\n"
        "m.free(ptr, 1 << 20)\n"
        "print('path', m.current.path)\n"
    )

    def env(self, **extra):
        path = FAKE_TORCH if INSTALLED else os.pathsep.join([FAKE_TORCH, PACKAGE_ROOT])
        return {"PYTHONPATH": path, "GPUMEM_LIBRARY": gpumem.library_path(), **extra}

    def test_use_installs_the_library_as_the_allocator(self):
        done = run_python("import gpumem.torch as gt\ngt.use()\ngt.use()\n" + self.ALLOCATE, self.env())
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("path " + gpumem.library_path(), done.stdout)

    def test_use_gives_each_graph_capture_a_pool_gpumem_can_follow(self):
        # The stand-in's streams never capture, so gpumem says it cannot follow the pool (on a
        # GPU the same call names the capture's pool): the point is what reaches PyTorch.
        code = catching_warnings(
            "import warnings, torch.cuda as c\nimport gpumem.torch as gt\ngt.use()\n",
            ["fresh, shared = c.CUDAGraph(), c.CUDAGraph()",
             "fresh.capture_begin()",
             "shared.capture_begin((7, 9), capture_error_mode='thread_local')"],
            "print('fresh', fresh.began_with)\nprint('shared', shared.began_with)\n"
            "print('warned', [str(w.message) for w in caught])\n",
        )
        done = run_python(code, self.env())
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("fresh ((0, 1), 'global')", done.stdout)
        self.assertIn("shared ((7, 9), 'thread_local')", done.stdout)
        self.assertIn("is not capturing a CUDA graph", done.stdout)

    def test_use_forwards_record_stream_to_gpumem(self):
        code = catching_warnings(
            "import warnings, torch, torch.cuda as c, torch.cuda.memory as m\n"
            "import gpumem.torch as gt\ngt.use()\n"
            "class Side:\n    cuda_stream = 0x5100\n"
            "ours, stranger = torch.Tensor(m.allocate(1 << 20)), torch.Tensor(0x1234)\n",
            ["ours.record_stream(Side())", "quiet = len(caught)", "stranger.record_stream(Side())"],
            "print('recorded', len(ours.recorded), 'quiet', quiet)\n"
            "print('warned', [str(w.message) for w in caught])\n"
            "m.free(ours.storage.ptr, 1 << 20)\n"
            "print('waiting', gt.memory_stats(0)['ffi_frees_waiting_for_streams'])\n"
        )
        done = run_python(code, self.env())
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("recorded 1 quiet 0", done.stdout)
        self.assertIn("0x1234 is not a live allocation", done.stdout)
        # Until the next allocation or free looks at its fence, the memory waits.
        self.assertIn("waiting 1", done.stdout)

    def test_without_the_layer_use_says_why_in_one_line_and_serves_pluggably(self):
        # The stand-in torch ships no C++ headers, so gpumem's PyTorch layer cannot be built.
        code = "import gpumem.torch as gt\ngt.use()\nprint('integration', gt.integration())\n"
        done = run_python(code, self.env())
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("integration pluggable", done.stdout)
        lines = done.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, done.stderr)
        self.assertIn("the PyTorch layer is unavailable (this PyTorch (0.0+fake) ships no C++", lines[0])
        self.assertIn("torch.cuda.memory_stats()", lines[0])

    def test_a_required_layer_that_cannot_be_built_is_an_error(self):
        code = ("import gpumem.torch as gt\ntry:\n    gt.use()\n"
                "except gt.GpumemError as error:\n    print('refused:', error)\n"
                "print('integration', gt.integration())\n")
        done = run_python(code, self.env(GPUMEM_TORCH_LAYER="require"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("refused: GPUMEM_TORCH_LAYER=require: this PyTorch", done.stdout)
        self.assertIn("integration None", done.stdout)
        done = run_python(code, self.env(GPUMEM_TORCH_LAYER="sometimes"))
        self.assertIn("refused: GPUMEM_TORCH_LAYER='sometimes' is not one of auto, require, off",
                      done.stdout)
        done = run_python(code, self.env(GPUMEM_TORCH_LAYER="off"))
        self.assertEqual(done.stderr, "", "off: no attempt, no line")
        self.assertIn("integration pluggable", done.stdout)

    def test_a_failing_call_is_reported_once_by_the_exception(self):
        code = ("import gpumem.torch as gt\ntry:\n    gt.serve('256.0.0.1:99999')\n"
                "except gt.GpumemError as error:\n    print('raised:', error)\n")
        done = run_python(code, self.env())
        self.assertIn("raised: gpumem_serve:", done.stdout, done.stderr)
        self.assertIn("256.0.0.1:99999", done.stdout)
        self.assertEqual(done.stderr, "", "not printed as well")

    def test_use_without_pytorch_says_so(self):
        code = ("import gpumem.torch as gt\ntry:\n    gt.use()\n"
                "except gt.GpumemError as error:\n    print('refused:', error)\n")
        env = {"PYTHONPATH": "" if INSTALLED else PACKAGE_ROOT, "GPUMEM_LIBRARY": gpumem.library_path()}
        done = run_python(code, env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("PyTorch is not installed here", done.stdout)

    def test_use_after_pytorch_allocated_says_what_to_do(self):
        code = "import torch.cuda.memory as m\nm.allocate(16)\nimport gpumem.torch as gt\ngt.use()\n"
        done = run_python(code, self.env())
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("before the first CUDA tensor", done.stderr)

    def test_gpumem_torch_variable_installs_it_when_torch_is_imported(self):
        # From the source tree, site.addsitedir processes the .pth exactly as site-packages would.
        code = ADD_PTH + "import torch\n" + self.ALLOCATE
        done = run_python(code, self.env(GPUMEM_TORCH="1"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("path ", done.stdout)

    def test_without_the_variable_nothing_changes(self):
        code = (
            ADD_PTH + "import sys, torch\n"
            "import torch.cuda.memory as m\nprint('allocator', m.current)\n"
            "print('gpumem loaded', 'gpumem' in sys.modules)\n"
        )
        done = run_python(code, {**self.env(), "GPUMEM_TORCH": "0"})
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("allocator None", done.stdout)
        self.assertIn("gpumem loaded False", done.stdout)

    def test_a_failing_autouse_reports_one_line_and_leaves_pytorch_alone(self):
        code = (
            ADD_PTH + "import torch\n"
            "import torch.cuda.memory as m\nprint('allocator', m.current)\n"
        )
        done = run_python(code, self.env(GPUMEM_TORCH="1", GPUMEM_LIBRARY="/nonexistent/libgpumem.so"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("allocator None", done.stdout)
        self.assertIn("gpumem: GPUMEM_TORCH is set", done.stderr)


class PublishWithoutTheLibrary(unittest.TestCase):
    """`gpumem.publish` is for processes that keep PyTorch's allocator: it must work where the
    library cannot be loaded, and importing the package must not try to."""

    def test_publishing_needs_no_library(self):
        with tempfile.TemporaryDirectory() as directory:
            code = (
                "import sys, gpumem, gpumem.publish, gpumem.torch\n"
                "path = gpumem.publish.publish_once(sys.argv[1])\n"
                "print('published', path)\n"
                "try:\n    gpumem.library_path()\n"
                "except gpumem.GpumemError as error:\n    print('no library:', error)\n"
            )
            env = {**os.environ, "GPUMEM_LIBRARY": os.path.join(directory, "absent", "libgpumem.so")}
            path = FAKE_TORCH if INSTALLED else os.pathsep.join([FAKE_TORCH, PACKAGE_ROOT])
            done = subprocess.run(
                [sys.executable, "-c", code, directory], env={**env, "PYTHONPATH": path},
                capture_output=True, text=True, timeout=120,
            )
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("no library: GPUMEM_LIBRARY names", done.stdout)
            published = done.stdout.split()[1]
            self.assertEqual(os.path.dirname(published), directory)
            with open(published) as f:
                document = json.load(f)
            self.assertEqual(document["format"], "gpumem.publish")
            self.assertEqual(document["writer"], "torch 0.0+fake")


    def test_a_missing_directory_is_named_and_publishing_needs_pytorch(self):
        missing = os.path.join(tempfile.gettempdir(), "gpumem-no-such-directory", "inner")
        path = FAKE_TORCH if INSTALLED else os.pathsep.join([FAKE_TORCH, PACKAGE_ROOT])
        code = (
            "import sys, gpumem.publish\n"
            "try:\n    gpumem.publish.publish_once(sys.argv[1])\n"
            "except FileNotFoundError as error:\n    print('refused:', error)\n"
        )
        done = subprocess.run([sys.executable, "-c", code, missing], env={**os.environ, "PYTHONPATH": path},
                              capture_output=True, text=True, timeout=120)
        self.assertIn(f"refused: the publish directory {missing} does not exist", done.stdout, done.stderr)
        code = (
            "import sys, gpumem.publish\n"
            "try:\n    gpumem.publish.start(sys.argv[1])\n"
            "except ImportError as error:\n    print('refused:', error)\n"
        )
        without_torch = "" if INSTALLED else PACKAGE_ROOT
        with tempfile.TemporaryDirectory() as directory:
            done = subprocess.run([sys.executable, "-c", code, directory],
                                  env={**os.environ, "PYTHONPATH": without_torch},
                                  capture_output=True, text=True, timeout=120)
        self.assertIn("refused: gpumem.publish publishes PyTorch's memory statistics, and PyTorch is "
                      "not installed", done.stdout, done.stderr)
        self.assertEqual(done.stderr, "")


@unittest.skipUnless(INSTALLED, "runs against the installed wheel (TEST_GPUMEM_INSTALLED=1)")
class InstalledWheel(unittest.TestCase):
    """What the wheel put where: the package in site-packages (not the source tree), its
    library inside it, the typing marker, and the .pth at the top of site-packages."""

    def test_the_package_is_the_installed_one(self):
        site_packages = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
        self.assertIn(os.path.realpath(PACKAGE_ROOT), site_packages)
        self.assertFalse(
            any(os.path.isfile(os.path.join(entry or ".", "gpumem", "torch.py"))
                for entry in sys.path if os.path.realpath(entry or ".") not in site_packages),
            f"a source tree's gpumem is on sys.path: {sys.path}",
        )

    def test_the_library_the_pth_and_the_marker_are_installed(self):
        saved = os.environ.pop("GPUMEM_LIBRARY", None)
        try:
            library = gpumem.library_path()
        finally:
            if saved is not None:
                os.environ["GPUMEM_LIBRARY"] = saved
        self.assertTrue(library.startswith(os.path.dirname(os.path.abspath(gpumem.__file__))), library)
        self.assertTrue(os.path.isfile(os.path.join(PACKAGE_ROOT, "gpumem-torch.pth")))
        self.assertTrue(os.path.isfile(os.path.join(PACKAGE_ROOT, "gpumem", "py.typed")))


if __name__ == "__main__":
    unittest.main()
