# Behaviour of gpumem as PyTorch's allocator at its edges, each case in its own process (a case
# may crash): an allocation larger than the device, side streams, and gpumem for one region of
# code through torch.cuda.MemPool (CUDA graphs: torch_graphs.py). Same set-up as
# torch_workloads.py.
#
# usage: python3 benches/gpu/torch_probes.py [--library PATH] [--python-dir DIR]
# Prints one JSON line per case: its exit code and the last lines it printed.
import json
import subprocess
import sys

import case_env

RECORD_STREAM = """
side = torch.cuda.Stream()
wrong, seen_waiting = 0, 0
for trial in range(20):
    x = torch.full((1 << 24,), 1.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):
            a = torch.tanh(a @ a)
        total = x.sum()
    x.record_stream(side)
    del x
    y = torch.full((1 << 24,), 7.0, device="cuda")
    if "gt" in globals():
        seen_waiting = max(seen_waiting, gt.memory_stats(0)["ffi_frees_waiting_for_streams"])
    torch.cuda.synchronize()
    wrong += float(total) != float(1 << 24)
    del y, a
print("trials with a wrong sum:", wrong, "of 20")
"""

CASES = {
    "out_of_memory": """
import torch, gpumem.torch as gt
gt.use()
small = torch.ones(1 << 20, device="cuda")
try:
    huge = torch.empty(1 << 45, dtype=torch.uint8, device="cuda")
    print("huge allocated?!", huge.data_ptr())
except Exception as e:
    print("raised:", type(e).__name__, str(e).splitlines()[0][:300])
print("process still usable:", float(small.sum()) == float(1 << 20))
""",
    "side_streams": """
import torch, gpumem.torch as gt
gt.use()
torch.manual_seed(0)
a, b = torch.cuda.Stream(), torch.cuda.Stream()
ok = True
for i in range(200):
    with torch.cuda.stream(a):
        t = torch.randn(1 << 18, device="cuda"); u = t * 2
    a.synchronize()
    del t
    with torch.cuda.stream(b):
        v = torch.full((1 << 18,), float(i), device="cuda")
    b.synchronize()
    ok = ok and bool((v == i).all()) and u.isfinite().all().item()
s = gt.memory_stats(0)
print("correct:", ok, "live:", s["allocation.all.current"], "hits/requests:", s["pool_hits"], s["pool_requests"])
print("current device kept:", torch.cuda.current_device() == 0)
""",
    # A tensor read on a side stream and freed before that stream is done: with record_stream
    # its memory must not be reused at once on its own stream (the fill below would overwrite
    # it before the side stream's sum reads it).
    "record_stream": """
import torch, gpumem.torch as gt
gt.use()
""" + RECORD_STREAM + """
print("waiting frees seen:", seen_waiting)
""",
    # The same with the forwarding bypassed: shows the hazard the case above guards against.
    "record_stream_unforwarded": """
import torch, gpumem.torch as gt
gt.use()
torch.Tensor.record_stream = torch._C.TensorBase.record_stream
""" + RECORD_STREAM,
    "record_stream_default": "import torch\n" + RECORD_STREAM,
    # GPUMEM_TORCH=1 through the package's .pth (site.addsitedir reads it as site-packages would).
    "gpumem_torch_variable": """
import os, site, sys
site.addsitedir(os.environ["GPUMEM_PYTHON_DIR"])
import torch
x = torch.randn(1 << 22, device="cuda")
import gpumem.torch as gt
print("gpumem is the allocator:", gt.in_use(), "holds:", gt.memory_stats(0)["allocated_bytes.all.current"] >= 1 << 24)
""",
    # The cost of one small tensor's allocation and free, from Python, under each allocator.
    "alloc_cost_default": """
import time, torch
x = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
for n in (1000, 50000):
    started = time.perf_counter()
    for _ in range(n):
        t = torch.empty(1 << 16, dtype=torch.uint8, device="cuda"); del t
    seconds = time.perf_counter() - started
print(f"ns per torch.empty + free: {seconds / n * 1e9:.0f}")
""",
    "mem_pool_region": """
import torch, gpumem, gpumem.torch as gt
from torch.cuda.memory import CUDAPluggableAllocator
allocator = CUDAPluggableAllocator(gpumem.library_path(), "gpumem_alloc", "gpumem_free")
pool = torch.cuda.MemPool(allocator.allocator())
before = torch.ones(1 << 20, device="cuda")
with torch.cuda.use_mem_pool(pool):
    with gt.tag("kv_cache"):
        inside = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
outside = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
stats = gt.memory_stats(0)
print("gpumem holds the region's tensor:", stats["allocated_bytes.all.current"] >= 64 << 20,
      "torch allocated:", torch.cuda.memory_allocated())
print("tags:", sorted({g["tag"] for d in gt.snapshot()["devices"] for g in d["by_tag"]}))
del inside
torch.cuda.synchronize()
print("freed back:", gt.memory_stats(0)["allocated_bytes.all.current"])
""",
}


def main():
    args = case_env.parse_args(__doc__)
    env = case_env.child_env(args)
    cases = dict(CASES)
    cases["alloc_cost_gpumem"] = "import gpumem.torch as gt\ngt.use()\n" + CASES["alloc_cost_default"]
    chosen = args.cases.split(",") if args.cases else list(cases)
    for name in chosen:
        code = cases[name]
        try:
            run_env = dict(env, GPUMEM_TORCH="1") if name == "gpumem_torch_variable" else env
            done = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True,
                                  timeout=120)
            lines = (done.stdout + done.stderr).strip().splitlines()
            print(json.dumps({"case": name, "exit": done.returncode, "output": lines[-8:]}), flush=True)
        except subprocess.TimeoutExpired:
            print(json.dumps({"case": name, "exit": None, "output": ["timed out after 120 s"]}), flush=True)


if __name__ == "__main__":
    main()
