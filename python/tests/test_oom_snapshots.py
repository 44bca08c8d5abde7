"""gpumem.oom_snapshots: PyTorch snapshots written beside the OOM flight records, without
PyTorch (a stand-in document and clock); the check that PyTorch's viewer opens a real one is
benches/gpu/torch_dropin.py --checks oom_snapshot on the GPU host."""
import io
import os
import pickle
import tempfile
import types
import unittest
from contextlib import redirect_stderr

from gpumem import oom_snapshots
from gpumem.oom_snapshots import OomSnapshots


class Clock:
    def __init__(self, now=1_700_000_000.25):
        self.now = now

    def __call__(self):
        return self.now


class OomSnapshotTests(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.clock = Clock()
        self.taken = 0

    def take(self):
        self.taken += 1
        return {"segments": [{"blocks": [{"size": 4096, "state": "active_allocated"}]}],
                "device_traces": [[]], "n": self.taken}

    def observer(self, **kwargs):
        return OomSnapshots(os.path.join(self.dir, "oom"), self.take, clock=self.clock, **kwargs)

    def test_a_refusal_writes_a_pickle_named_as_the_records_are(self):
        observer = self.observer()
        observer(1, 10, 100, 5)
        names = os.listdir(os.path.join(self.dir, "oom"))
        self.assertEqual(names, [f"20231114T221320.250Z-oom-gpu1-pid{os.getpid()}.pickle"])
        with open(os.path.join(self.dir, "oom", names[0]), "rb") as f:
            self.assertEqual(pickle.load(f)["n"], 1)

    def test_refusals_closer_than_the_gap_write_one_per_device(self):
        observer = self.observer(min_gap=10.0)
        for _ in range(5):
            observer(0)
            self.clock.now += 1
        observer(1)
        self.assertEqual(self.taken, 2)
        self.clock.now += 10
        observer(0)
        self.assertEqual(self.taken, 3)
        self.assertEqual(len(os.listdir(os.path.join(self.dir, "oom"))), 3)

    def test_the_directory_keeps_the_newest_within_its_bounds(self):
        observer = self.observer(max_files=3, min_gap=0.0)
        for _ in range(6):
            observer(0)
            self.clock.now += 1
        names = sorted(os.listdir(os.path.join(self.dir, "oom")))
        self.assertEqual(len(names), 3)
        self.assertTrue(names[0].startswith("20231114T221323.250Z"), names)
        size = os.path.getsize(os.path.join(self.dir, "oom", names[0]))
        # A byte bound that holds two snapshots keeps two, the newest.
        small = self.observer(max_bytes=2 * size, min_gap=0.0)
        small(0)
        self.assertEqual(len(small.listing()), 2)

    def test_the_flight_records_and_other_files_are_left_alone(self):
        oom = os.path.join(self.dir, "oom")
        os.makedirs(oom)
        kept = ["20231114T000000.000Z-oom-gpu0.json", "notes.pickle", "gpumem-42.json"]
        for name in kept:
            open(os.path.join(oom, name), "w").close()
        observer = self.observer(max_files=1, min_gap=0.0)
        observer(0)
        self.clock.now += 1
        observer(0)
        names = sorted(os.listdir(oom))
        self.assertEqual([n for n in names if n not in kept],
                         [f"20231114T221321.250Z-oom-gpu0-pid{os.getpid()}.pickle"])
        self.assertEqual(len(names), 4)

    def test_a_snapshot_that_fails_costs_one_line_and_no_exception(self):
        def broken():
            raise RuntimeError("no snapshot today")

        observer = OomSnapshots(os.path.join(self.dir, "oom"), broken, clock=self.clock)
        stderr = io.StringIO()
        with redirect_stderr(stderr):
            observer(0)
        self.assertEqual(stderr.getvalue().count("\n"), 1)
        self.assertIn("no snapshot today", stderr.getvalue())
        self.assertEqual(observer.written, [])

    def test_an_unwritable_directory_leaves_no_temporary_file(self):
        blocker = os.path.join(self.dir, "oom")
        open(blocker, "w").close()  # a file where the directory should be
        observer = self.observer()
        stderr = io.StringIO()
        with redirect_stderr(stderr):
            observer(0)
        self.assertIn(blocker, stderr.getvalue())
        self.assertEqual(os.listdir(self.dir), ["oom"])

    def test_attach_registers_one_observer_per_directory_that_reads_the_snapshot_late(self):
        observers = []
        memory = types.SimpleNamespace(_snapshot=lambda: {"first": True})
        torch = types.SimpleNamespace(
            cuda=types.SimpleNamespace(memory=memory),
            _C=types.SimpleNamespace(_cuda_attach_out_of_memory_observer=observers.append))
        directory = os.path.join(self.dir, "oom")
        first = oom_snapshots.attach(torch, directory)
        self.assertIs(oom_snapshots.attach(torch, directory), first)
        self.assertEqual(observers, [first])
        memory._snapshot = lambda: {"wrapped": True}  # as gpumem.torch.use() wraps it
        first(0)
        with open(first.written[0], "rb") as f:
            self.assertEqual(pickle.load(f), {"wrapped": True})


if __name__ == "__main__":
    unittest.main()
