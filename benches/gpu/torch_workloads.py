# PyTorch workloads under three allocators, each run in its own process with the same seed:
# PyTorch's default caching allocator, PyTorch with expandable_segments:True, and gpumem
# (gpumem.torch.use()). Checks that losses / outputs are identical and reports, per run: NVML's
# per-process peak memory, the allocator's peak allocated and reserved bytes, and step time.
# Results for docs/pytorch.md.
#
# Needs a GPU host with PyTorch and transformers (timm or torchvision for the CNN, else a small
# CNN defined here); randomly initialised models, nothing downloaded. gpumem comes from the
# python/ package of the repository and its library from GPUMEM_LIBRARY or --library (a build's
# target/release/libgpumem.so, or the copy `pip install ./python` put into the package).
#
# usage: python3 benches/gpu/torch_workloads.py [--quick] [--size small|large] [--library PATH] [--python-dir DIR]
#                                               [--workloads gpt2_train,hf_generate,cnn_serve]
#                                               [--workloads ppo_rollout_train,gan_train_multires,...]
#                                               [--modes default,gpumem] [--repeat N] [--rounds N] [--profile]
#                                               [--other-library PATH] [--other-config FILE]  (mode gpumem_other)
# Prints one JSON line per run, then a short table. --repeat N runs the modes N times in turn
# (default, gpumem, default, gpumem, ...): step times drift between processes on these hosts by
# more than the allocators differ, and interleaving spreads the drift over both; the table then
# gives each mode's median round time (a round runs every shape once) over its runs and the
# ratio of the medians. --cpus pins every run to the same cores. With $OUT set, every run's result is appended
# to $OUT/results.jsonl (`--table FILE` prints the table of such a file), and the gpumem training
# run leaves its /metrics scrape and snapshot, taken after its last step, there (metrics.txt,
# snapshot.json). Each step is timed whole, up to its last kernel queued (host) and between CUDA
# events around its work (device); --profile adds one round under torch.profiler.
# Any workload of the recorded sets (unseen_workloads.py, the workloads the allocator was not
# tuned on) runs here too, whole, as one step a round: see recorded_workload.
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# "default_again" repeats the default run: outputs that differ between two default runs are the
# workload's own run-to-run variation, not the allocator's doing. "gpumem_unserved" is gpumem
# without the exporter the gpumem training run serves /metrics from (its sampler thread reads
# NVML and the pools every second).
# "gpumem_wait" is gpumem with no room past the cache budget (room_without_waiting 0, as the
# constrained preset has it): a miss making room waits for the GPU to finish with the idle pages.
# ("gpumem" itself has the default room: such a miss does not wait while it stays within 256 MiB
# past the budget.)
# "gpumem_nowait" is gpumem with make_room_without_waiting: no miss waits, however far past the
# budget that takes the process.
# "gpumem_placed" is gpumem with place_on_mapped_pages: blocks go to free mapped pages first.
# "gpumem_other" is a second gpumem beside the first, run in the same interleaved turns: another
# build's library (--other-library) and/or a configuration file (--other-config, GPUMEM_CONFIG),
# so that two builds or two settings are compared process by process on one host.
# "floor" is the cheapest allocator PyTorch's pluggable interface can call (floor_allocator.c,
# built with nvcc on first use): what the interface costs by itself, apart from gpumem's share.
MODES = ("default", "default_again", "expandable", "gpumem", "gpumem_unserved", "gpumem_wait", "gpumem_nowait",
         "gpumem_placed", "gpumem_other",
         "floor")
# "alloc_loop" times tensor creation alone (a window of live tensors, the oldest dropped as each
# new one is made) at three sizes: the per-allocation cost of each allocator as PyTorch sees it.
WORKLOADS = ("gpt2_train", "hf_generate", "cnn_serve")
EXTRA_WORKLOADS = ("alloc_loop",)
MARK = "RESULT "


def recorded_names():
    """The workloads of unseen_workloads.py, read from its source: the parent checks names
    without importing torch."""
    import ast

    with open(os.path.join(HERE, "unseen_workloads.py")) as f:
        tree = ast.parse(f.read())
    return tuple(node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                 and ast.get_docstring(node) and not node.args.args)


# ---------------------------------------------------------------- NVML, read without pynvml
class ProcessMemory:
    """Polls NVML every few milliseconds for this process's device memory; keeps the peak.
    NVML reports host pids: inside a container that does not share them, the sole compute
    process on the device is taken to be this one (the run is alone on the GPU)."""

    def __init__(self, device=0, period=0.005):
        import ctypes

        self.ctypes = ctypes
        self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if self.nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.handle = ctypes.c_void_p()
        if self.nvml.nvmlDeviceGetHandleByIndex_v2(device, ctypes.byref(self.handle)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex failed")

        class Info(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                        ("gpu_instance", ctypes.c_uint), ("compute_instance", ctypes.c_uint)]

        self.Info = Info
        self.period = period
        self.peak = 0
        self.matched = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def read(self):
        ctypes = self.ctypes
        count = ctypes.c_uint(64)
        infos = (self.Info * 64)()
        if self.nvml.nvmlDeviceGetComputeRunningProcesses_v3(self.handle, ctypes.byref(count), infos) != 0:
            return None
        processes = [(infos[i].pid, infos[i].used) for i in range(count.value)]
        mine = [used for pid, used in processes if pid == os.getpid()]
        if mine:
            self.matched = "pid"
            return mine[0]
        if len(processes) == 1:
            self.matched = "sole process"
            return processes[0][1]
        return None

    def loop(self):
        while not self.stop.is_set():
            used = self.read()
            if used is not None and used < (1 << 60):
                self.peak = max(self.peak, used)
            time.sleep(self.period)

    def start(self):
        self.thread.start()
        return self

    def finish(self):
        self.stop.set()
        self.thread.join()
        used = self.read()
        if used is not None and used < (1 << 60):
            self.peak = max(self.peak, used)
        return self.peak


# ---------------------------------------------------------------- the workloads (child side)
class StepClock:
    """Times each step three ways: wall time between two device synchronisations; the host's
    share, until the step's last kernel is queued; and the device's, between CUDA events recorded
    before and after its work. A gap between allocators in the host share is host-side cost (the
    allocator's calls, its threads); one only in the device share is in the kernels themselves.
    Every step is kept, not only the median: a median hides a run that is slow some of the time.
    With `profile`, the last round is run once more under torch.profiler, untimed. `misses`,
    under gpumem, reads its count of misses and their time in all: each step's share is kept."""

    def __init__(self, torch, profile, misses=None, allocations=None):
        self.torch = torch
        self.profile = profile
        self.misses = misses
        self.allocations = allocations
        self.wall, self.host, self.device, self.miss_counts, self.miss_ms = [], [], [], [], []
        self.wait_ms = []
        self.allocs = []

    @contextlib.contextmanager
    def step(self, timed):
        torch = self.torch
        torch.cuda.synchronize()
        misses_before = self.misses() if self.misses else None
        allocs_before = self.allocations() if self.allocations else None
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started = time.perf_counter()
        begin.record()
        yield
        end.record()
        queued = time.perf_counter()
        torch.cuda.synchronize()
        if timed:
            self.wall.append(time.perf_counter() - started)
            self.host.append(queued - started)
            self.device.append(begin.elapsed_time(end) / 1e3)
            if allocs_before is not None:
                self.allocs.append(self.allocations() - allocs_before)
            if misses_before:
                count, ns, waited_ns = self.misses()
                self.miss_counts.append(count - misses_before[0])
                self.miss_ms.append((ns - misses_before[1]) / 1e6)
                self.wait_ms.append((waited_ns - misses_before[2]) / 1e6)

    def profiled(self, run_round):
        """Runs `run_round()` under torch.profiler; the busiest operators, per step."""
        if not self.profile:
            return {}
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            steps = run_round()
        rows = prof.key_averages()
        device_us = sum(getattr(r, "self_device_time_total", 0) for r in rows)
        cpu_us = sum(r.self_cpu_time_total for r in rows)
        top = sorted(rows, key=lambda r: r.self_cpu_time_total, reverse=True)[:20]
        return {"profile": {
            "steps": steps, "self_cpu_ms_per_step": cpu_us / 1e3 / steps,
            "device_ms_per_step": device_us / 1e3 / steps,
            "top_cpu": [[r.key, round(r.self_cpu_time_total / steps), r.count // steps] for r in top]}}

    def result(self, steps_per_round):
        """The steps of a round differ in shape, so a median over steps lands between two shapes
        and jumps with one slow step: the figure compared is the median over rounds of a
        round's total (every shape once), with the steps kept too."""
        ms = lambda times: [round(t * 1e3, 3) for t in times]  # noqa: E731
        rounds = [sum(self.wall[i:i + steps_per_round]) for i in range(0, len(self.wall), steps_per_round)]
        return {"round_seconds": statistics.median(rounds), "round_ms": ms(rounds),
                "step_seconds": statistics.median(self.wall), "steps": len(self.wall),
                "host_seconds": statistics.median(self.host),
                "device_seconds": statistics.median(self.device),
                "step_ms": ms(self.wall), "host_ms": ms(self.host), "device_ms": ms(self.device),
                **({"allocations_per_step": statistics.median(self.allocs)} if self.allocs else {}),
                **({"step_misses": self.miss_counts, "step_miss_ms": [round(t, 3) for t in self.miss_ms],
                    "step_gpu_wait_ms": [round(t, 3) for t in self.wait_ms]}
                   if self.misses else {})}


# The workloads at two sizes. "small" is what docs/pytorch.md measured first (GPT-2 6 x 512
# training holds ~3 GB). "large" is a process that fills half an 80 GB GPU, as the processes
# whose memory runs out do: GPT-2 medium training at eight times the batch (~40 GB allocated),
# GPT-2 large generating at up to 96 x 1,056 tokens of cache (~25 GB), ResNet-50 serving
# 384 x 384 images at up to 2,048 a batch (~30 GB). There the CUDA context's ~520 MiB, which no
# allocator can give back, is 1-2 % of the process instead of 15-30 %.
SIZES = {
    "small": {
        "gpt2_train": dict(layers=6, width=512, heads=8, rounds=6, batch_scale=1),
        "hf_generate": dict(layers=12, width=768, heads=12, rounds=2,
                            shapes=[(1, 32), (8, 128), (4, 512), (16, 64), (2, 256), (8, 32), (32, 128), (4, 64)]),
        "cnn_serve": dict(rounds=5, side=224, batches=[1, 8, 32, 4, 64, 16, 2, 48, 128, 8]),
    },
    "large": {
        "gpt2_train": dict(layers=24, width=1024, heads=16, rounds=3, batch_scale=8),
        "hf_generate": dict(layers=36, width=1280, heads=20, rounds=1,
                            shapes=[(4, 128), (32, 512), (16, 1024), (64, 256), (8, 1024), (32, 128), (96, 1024), (16, 256)]),
        "cnn_serve": dict(rounds=3, side=384, batches=[16, 128, 512, 64, 1024, 256, 32, 768, 2048, 128]),
    },
}


# --rounds: how many timed rounds each run takes, whatever --quick says (None: as it says).
ROUNDS = None


def timed_rounds(quick, quick_rounds, full_rounds):
    return ROUNDS or (quick_rounds if quick else full_rounds)


def gpt2_train(torch, quick, tags, at_end, clock, size):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = SIZES[size]["gpt2_train"]
    shapes = [(8, 128), (4, 512), (16, 64), (2, 1024), (8, 256), (4, 256), (12, 128), (6, 384)]
    shapes = [(batch * cfg["batch_scale"], length) for batch, length in shapes]
    rounds = timed_rounds(quick, 2, cfg["rounds"])
    with tags("weights"):
        config = GPT2Config(n_layer=cfg["layers"], n_embd=cfg["width"], n_head=cfg["heads"],
                            n_positions=1024, vocab_size=50257)
        model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator(device="cpu").manual_seed(1)
    losses = []

    def run_round(timed):
        for batch, length in shapes:
            ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator).cuda()
            with clock.step(timed):
                with tags("activations"), torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(ids, labels=ids).loss
                with tags("gradients", all_threads=True):
                    loss.backward()
                with tags("optimizer"):
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.item()))
        return len(shapes)

    for r in range(rounds + 1):
        run_round(timed=r > 0)  # round 0 warms up every shape
    at_end()  # while the model, its gradients and the optimizer's state are alive
    outputs = list(losses)
    return {"outputs": outputs, **clock.result(len(shapes)), **clock.profiled(lambda: run_round(False))}


def hf_generate(torch, quick, tags, at_end, clock, size):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = SIZES[size]["hf_generate"]
    shapes = cfg["shapes"]
    rounds = timed_rounds(quick, 1, cfg["rounds"])
    with tags("weights"):
        # Room for the longest prompt and the 32 tokens generated after it.
        positions = max(1024, max(length for _, length in shapes) + 32)
        config = GPT2Config(n_layer=cfg["layers"], n_embd=cfg["width"], n_head=cfg["heads"],
                            n_positions=positions)
        model = GPT2LMHeadModel(config).to(device="cuda", dtype=torch.float16).eval()
    generator = torch.Generator(device="cpu").manual_seed(2)
    digests = []

    def run_round(timed):
        for batch, length in shapes:
            ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator).cuda()
            with clock.step(timed), torch.inference_mode(), tags("kv_cache"):
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                                     do_sample=False, pad_token_id=config.eos_token_id)
            digests.append(int(out.long().sum().item()) * 1000003 + int((out.long() * out.long()).sum().item()))
        return len(shapes)

    for r in range(rounds + 1):
        run_round(timed=r > 0)
    at_end()
    outputs = list(digests)
    return {"outputs": outputs, **clock.result(len(shapes)), **clock.profiled(lambda: run_round(False))}


def alloc_loop(torch, quick, tags, at_end, clock, size):
    sizes = [4 << 10, 1 << 20, 64 << 20]
    # Deterministic mode fills every new tensor with NaN, a kernel per allocation: not timed here.
    torch.utils.deterministic.fill_uninitialized_memory = False
    pairs, window = (2_000 if quick else 20_000), 4
    rounds = timed_rounds(quick, 1, 3)

    def run_round(timed):
        for nbytes in sizes:
            live = [torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(window)]
            with clock.step(timed):
                for i in range(pairs):
                    live[i % window] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            del live
        return len(sizes)

    for r in range(rounds + 1):
        run_round(timed=r > 0)
    at_end()
    return {"outputs": [], "pairs_per_step": pairs, "sizes": sizes, **clock.result(len(sizes))}


class OutputPrint:
    """What a workload computed, for workloads that return nothing: the float64 sum of every
    floating tensor that a top-level module call returns (a call made from no other module's
    forward), kept on the device in a fixed buffer so that recording adds no allocation that
    lives past the call. An allocator must change no value, so runs under any two allocators
    agree exactly where the workload's kernels are deterministic."""

    SLOTS = 1 << 16

    def __init__(self, torch):
        self.torch = torch
        self.sums = torch.zeros(self.SLOTS, dtype=torch.float64, device="cuda")
        self.calls = 0
        self.depth = 0
        modules = torch.nn.modules.module
        self.handles = [modules.register_module_forward_pre_hook(self.entered),
                        modules.register_module_forward_hook(self.left)]

    def entered(self, module, inputs):
        self.depth += 1

    def left(self, module, inputs, output):
        self.depth -= 1
        if self.depth == 0:
            for tensor in self.tensors(output):
                self.sums[self.calls % self.SLOTS] += self.torch.sum(tensor.detach(), dtype=self.torch.float64)
                self.calls += 1

    def tensors(self, output):
        torch = self.torch
        if isinstance(output, torch.Tensor):
            if output.is_floating_point() and output.is_cuda:
                yield output
        elif isinstance(output, dict):  # Hugging Face's ModelOutput is one
            for value in output.values():
                yield from self.tensors(value)
        elif isinstance(output, (tuple, list)):
            for value in output:
                yield from self.tensors(value)

    def finish(self):
        for handle in self.handles:
            handle.remove()
        used = min(self.calls, self.SLOTS)
        return [repr(value) for value in self.sums[:used].tolist()]


def recorded_workload(name):
    """A workload of the recorded sets as this script's workloads are: run whole once to warm
    up, then once a timed round, each run from the same seeds. Its outputs are OutputPrint's."""
    def run(torch, quick, tags, at_end, clock, size):
        import random

        import unseen_workloads

        workload = getattr(unseen_workloads, name)
        printed = OutputPrint(torch)
        rounds = timed_rounds(quick, 1, 3)
        for r in range(rounds + 1):
            torch.manual_seed(0)
            random.seed(0)
            with clock.step(timed=r > 0), tags("activations"):
                workload()
        at_end()
        return {"outputs": printed.finish(), "output_calls": printed.calls, **clock.result(1)}
    return run


def workload_function(name):
    if name in WORKLOADS + EXTRA_WORKLOADS:
        return globals()[name]
    return recorded_workload(name)


def floor_library():
    """floor_allocator.c built next to the results (or beside this script), once."""
    where = os.environ.get("OUT") or HERE
    library = os.path.join(where, "floor_allocator.so")
    if not os.path.exists(library):
        subprocess.run(["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", "-o", library,
                        os.path.join(HERE, "floor_allocator.c")], check=True)
    return library


def cnn_model(torch):
    try:
        import timm

        return "timm resnet50", timm.create_model("resnet50", pretrained=False)
    except Exception:
        pass
    try:
        import torchvision

        return "torchvision resnet50", torchvision.models.resnet50(weights=None)
    except Exception:
        pass
    nn = torch.nn
    layers, channels = [], 3
    for width in (64, 128, 256, 512):
        layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        channels = width
    return "small CNN", nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


def cnn_serve(torch, quick, tags, at_end, clock, size):
    cfg = SIZES[size]["cnn_serve"]
    batches, side = cfg["batches"], cfg["side"]
    rounds = timed_rounds(quick, 2, cfg["rounds"])
    with tags("weights"):
        name, model = cnn_model(torch)
        model = model.to(device="cuda", dtype=torch.float16, memory_format=torch.channels_last).eval()
    # Large batches are drawn on the device (gigabytes a batch would take the host seconds);
    # the same seed on the same GPU draws the same images under every allocator.
    on_device = size != "small"
    generator = torch.Generator(device="cuda" if on_device else "cpu").manual_seed(3)
    sums = []

    def images_of(batch):
        if on_device:
            drawn = torch.randn((batch, 3, side, side), generator=generator, device="cuda",
                                dtype=torch.float16)
            return drawn.contiguous(memory_format=torch.channels_last)
        return torch.randn((batch, 3, side, side), generator=generator).to(
            device="cuda", dtype=torch.float16, memory_format=torch.channels_last)

    def run_round(timed):
        for batch in batches:
            images = images_of(batch)
            with clock.step(timed), torch.inference_mode(), tags("activations"):
                logits = model(images)
            sums.append(repr(float(logits.float().sum().item())))
        return len(batches)

    for r in range(rounds + 1):
        run_round(timed=r > 0)
    at_end()
    outputs = list(sums)
    return {"outputs": outputs, **clock.result(len(batches)), **clock.profiled(lambda: run_round(False)),
            "model": name}


def child(args):
    """One workload under one allocator, in this process; prints one RESULT line."""
    global ROUNDS
    ROUNDS = args.rounds
    gpumem_torch = None
    if args.mode.startswith("gpumem"):
        import gpumem.torch as gpumem_torch

        gpumem_torch.use()
    import torch

    floor = None
    if args.mode == "floor":
        import ctypes

        library = floor_library()
        floor = ctypes.CDLL(library)
        floor.floor_allocations.restype = ctypes.c_size_t
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(library, "floor_alloc", "floor_free"))
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    # Strict: an operator without a deterministic kernel fails the run instead of warning. With
    # warn_only, GPT-2 medium's attention backward at the large batches ran on cuDNN's
    # nondeterministic algorithm, and two runs of PyTorch's own allocator disagreed. The recorded
    # sets were written without that constraint (gan_train_multires's adaptive pooling has no
    # deterministic backward), so they warn instead, and default_again shows how far their own
    # kernels vary from run to run.
    torch.use_deterministic_algorithms(True, warn_only=args.workload not in WORKLOADS + EXTRA_WORKLOADS)
    torch.cuda.init()
    torch.cuda.synchronize()
    memory = ProcessMemory().start()
    time.sleep(0.05)
    baseline = memory.peak  # the CUDA context before any tensor

    if gpumem_torch is not None:
        tags = gpumem_torch.tag
        serves = args.workload == "gpt2_train" and args.mode == "gpumem"
        url = gpumem_torch.serve("127.0.0.1:0") if serves else None
    else:
        def tags(name, all_threads=False):
            return contextlib.nullcontext()
        url = None

    scraped = {}

    def at_end():
        if url:
            scrape(url, scraped)

    started = time.perf_counter()
    misses = None
    if gpumem_torch is not None:
        def misses():
            stats = gpumem_torch.memory_stats(0)
            return stats["pool_misses"], stats["pool_miss_ns_total"], stats.get("pool_gpu_wait_ns_total", 0)
    if gpumem_torch is not None:
        def allocations():
            return gpumem_torch.memory_stats(0)["allocation.all.allocated"]
    elif floor is not None:
        allocations = floor.floor_allocations
    else:
        def allocations():
            return torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    clock = StepClock(torch, args.profile, misses, allocations)
    result = workload_function(args.workload)(torch, args.quick, tags, at_end, clock, args.size)
    wall = time.perf_counter() - started
    result.update(scraped)
    torch.cuda.synchronize()
    result.update(workload=args.workload, mode=args.mode, wall_seconds=wall,
                  nvml_peak_bytes=memory.finish(), nvml_context_bytes=baseline,
                  nvml_matched=memory.matched, torch=torch.__version__, size=args.size,
                  device=torch.cuda.get_device_name(0))
    if floor is not None:
        result.update(peak_allocated_bytes=0, peak_reserved_bytes=0)
    elif gpumem_torch is None:
        result.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                      peak_reserved_bytes=torch.cuda.max_memory_reserved())
    else:
        stats = gpumem_torch.memory_stats(0)
        result.update(peak_allocated_bytes=stats["allocated_bytes.all.peak"],
                      peak_requested_bytes=stats["requested_bytes.all.peak"],
                      peak_reserved_bytes=stats["reserved_bytes.all.peak"],
                      pool_hits=stats["pool_hits"], pool_requests=stats["pool_requests"],
                      driver_maps=stats["num_device_alloc"],
                      adaptive_level=stats.get("cache_adaptive_level"),
                      room_without_waiting_bytes=stats.get("cache_room_without_waiting_bytes"),
                      longest_gpu_wait_ms=stats.get("pool_gpu_wait_ns_longest", 0) / 1e6,
                      lending=stats.get("cache_stream_ordered_reuse"),
                      lendings=stats.get("pool_lendings"))
    print(MARK + json.dumps(result), flush=True)


def scrape(url, result):
    """The exporter inside the training process: /metrics and the snapshot's tags."""
    import urllib.request

    time.sleep(1.2)  # one more sample after the last step
    metrics = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    snapshot = json.loads(urllib.request.urlopen(url + "api/v1/snapshot", timeout=10).read())
    result["tags_in_snapshot"] = sorted({g["tag"] for d in snapshot["devices"] for g in d["by_tag"]})
    result["metrics_series"] = sum(1 for line in metrics.splitlines() if line and not line.startswith("#"))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "metrics.txt"), "w") as f:
            f.write(metrics)
        with open(os.path.join(out, "snapshot.json"), "w") as f:
            json.dump(snapshot, f)


# ---------------------------------------------------------------- the driver (parent side)
def run_child(workload, mode, args):
    env = dict(os.environ)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("GPUMEM_TORCH", None)
    env.pop("GPUMEM_MAKE_ROOM_WITHOUT_WAITING", None)
    env.pop("GPUMEM_PLACE_ON_MAPPED_PAGES", None)
    env.pop("GPUMEM_ROOM_WITHOUT_WAITING", None)
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if mode == "gpumem_wait":
        env["GPUMEM_ROOM_WITHOUT_WAITING"] = "0"
    if mode == "gpumem_nowait":
        env["GPUMEM_MAKE_ROOM_WITHOUT_WAITING"] = "true"
    if mode == "gpumem_placed":
        env["GPUMEM_PLACE_ON_MAPPED_PAGES"] = "true"
    if args.library:
        env["GPUMEM_LIBRARY"] = os.path.abspath(args.library)
    if mode == "gpumem_other":
        if args.other_library:
            env["GPUMEM_LIBRARY"] = os.path.abspath(args.other_library)
        if args.other_config:
            env["GPUMEM_CONFIG"] = os.path.abspath(args.other_config)
    # --python-dir installed: the gpumem package installed in this interpreter (a wheel), not
    # the repository's source tree.
    source = None if args.python_dir == "installed" else os.path.abspath(args.python_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    command = [sys.executable, os.path.abspath(__file__), "--child", "--workload", workload, "--mode", mode]
    command += ["--size", args.size]
    if args.quick:
        command.append("--quick")
    if args.rounds:
        command += ["--rounds", str(args.rounds)]
    if args.profile:
        command.append("--profile")
    pin = (lambda: os.sched_setaffinity(0, args.cpus)) if args.cpus else None
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout,
                          preexec_fn=pin)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK):])
            if mode == "gpumem_other":  # which second gpumem this was, for the record
                result["other"] = {"library": env.get("GPUMEM_LIBRARY"), "config": env.get("GPUMEM_CONFIG")}
            return result
    tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
    return {"workload": workload, "mode": mode, "error": f"exit {done.returncode}: " + " | ".join(tail)}


def mib(b):
    return f"{b / (1 << 20):,.0f}" if isinstance(b, (int, float)) else "-"


def median_round(results, workload, mode):
    """The median over a mode's runs of each run's median round (one pass over every shape)."""
    rounds = [r["round_seconds"] for r in results
              if r["workload"] == workload and r["mode"] == mode and "round_seconds" in r]
    return (statistics.median(rounds), len(rounds)) if rounds else (None, 0)


def miss_ms_per_round(results, workload, mode):
    """gpumem's time inside its misses per timed round, the median over a mode's runs ("-" for
    allocators that do not report it): the part of a round that is the allocator's own, which
    the rounds' process-to-process noise hides."""
    per_run = [sum(r["step_miss_ms"]) / len(r["round_ms"]) for r in results
               if r["workload"] == workload and r["mode"] == mode and r.get("step_miss_ms") and r.get("round_ms")]
    return f"{statistics.median(per_run):.1f}" if per_run else "-"


def step_table(results):
    """Each step of a round (one shape each) as the median over a mode's runs of each run's
    median over its rounds: the host's drift moves every step of a slow process, while an
    allocator's cost shows in the steps it is paid in (a wait at a miss, in the step the GPU
    paces), which the round times' spread hides."""
    rows = []
    for workload in dict.fromkeys(r["workload"] for r in results):
        per_mode = {}
        for r in results:
            rounds = len(r.get("round_ms") or [])
            steps = r.get("step_ms") or []
            if r["workload"] != workload or "error" in r or not rounds or len(steps) % rounds:
                continue
            shapes = len(steps) // rounds
            per_mode.setdefault(r["mode"], []).append(
                [statistics.median(steps[i::shapes]) for i in range(shapes)])
        widths = {len(runs[0]) for runs in per_mode.values()}
        if len(widths) != 1:
            continue
        shapes = widths.pop()
        rows += [f"| {workload}: ms a step, by step of the round | " + " | ".join(str(i + 1) for i in range(shapes)) + " |",
                 "| --- |" + " --- |" * shapes]
        for mode in MODES:
            runs = per_mode.get(mode)
            if runs:
                cells = [f"{statistics.median(run[i] for run in runs):.2f}" for i in range(shapes)]
                rows.append(f"| {mode} ({len(runs)} runs) | " + " | ".join(cells) + " |")
        rows.append("")
    return "\n".join(rows)


def table(results):
    rows = ["| workload | allocator | outputs | NVML peak MiB (every run) | context MiB | peak allocated MiB | "
            "peak reserved MiB | NVML / allocated | beyond context / allocated | round ms | vs default | runs | driver maps | "
            "miss ms a round | allocs/step |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for workload in dict.fromkeys(r["workload"] for r in results):
        runs, every_run = {}, {}
        for r in results:  # the first run of each mode stands for its memory; every run's outputs count
            if r["workload"] == workload:
                runs.setdefault(r["mode"], r)
                every_run.setdefault(r["mode"], []).append(r)
        reference = runs.get("default", {})
        reference_round, _ = median_round(results, workload, "default")
        for mode in MODES:
            r = runs.get(mode)
            if r is None:
                continue
            if "error" in r:
                rows.append(f"| {workload} | {mode} | failed: {r['error'][:120]} | | | | | | | | | | | |")
                continue
            # Outputs, memory and time are judged against the default allocator's run; without
            # one in this call there is nothing to judge against, and the columns say so.
            theirs = reference.get("outputs")
            if theirs is None:
                same = "no default run"
            else:
                def differing(run):
                    outputs = run.get("outputs", [])
                    return sum(1 for a, b in zip(outputs, theirs) if a != b) + abs(len(outputs) - len(theirs))
                differ = [differing(run) for run in every_run[mode] if "error" not in run]
                worst = max(differ)
                same = ("identical" if worst == 0 else
                        f"{sum(1 for d in differ if d)} of {len(differ)} runs differ (up to {worst}/{len(theirs)})")
            allocated = reference.get("peak_allocated_bytes")
            ratio = f"{r['nvml_peak_bytes'] / allocated:.3f}" if allocated else "-"
            # What the process holds beyond the CUDA context it had before its first tensor.
            beyond = f"{(r['nvml_peak_bytes'] - r['nvml_context_bytes']) / allocated:.3f}" if allocated else "-"
            round_time, count = median_round(results, workload, mode)
            speed = f"{round_time / reference_round:.3f}" if reference_round and round_time else "-"
            peaks = sorted(run["nvml_peak_bytes"] for run in every_run[mode] if "error" not in run)
            peak = mib(peaks[0]) if peaks[0] == peaks[-1] else f"{mib(peaks[0])}–{mib(peaks[-1])}"
            rows.append(f"| {workload} | {mode} | {same} | {peak} | "
                        f"{mib(r['nvml_context_bytes'])} | {mib(r['peak_allocated_bytes'])} | "
                        f"{mib(r['peak_reserved_bytes'])} | {ratio} | {beyond} | {(round_time or 0) * 1e3:.1f} | "
                        f"{speed} | {count} | {r.get('driver_maps', '-')} | "
                        f"{miss_ms_per_round(results, workload, mode)} | "
                        f"{r.get('allocations_per_step', '-')} |")
    return "\n".join(rows)


def cpu_list(text):
    """'2-7' or '2,3,4' (or both, '0,2-3') as a set of core numbers."""
    cores = set()
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            cores.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of cores such as 2-7 or 2,3,4")
    if not cores:
        raise argparse.ArgumentTypeError("no cores given")
    return cores


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small",
                        help="small: the first measured models (~3 GB); large: half an 80 GB GPU (see SIZES)")
    parser.add_argument("--library", help="libgpumem.so to use (default: $GPUMEM_LIBRARY or the package's)")
    parser.add_argument("--python-dir", default=os.path.join(HERE, "..", "..", "python"),
                        help="directory holding the gpumem package (default: the repository's python/; "
                             "installed: the package installed in this interpreter, e.g. from a wheel)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS + EXTRA_WORKLOADS)}, "
                             "or any of the recorded sets (unseen_workloads.py)")
    parser.add_argument("--modes", default=",".join(m for m in MODES if m not in ("floor", "gpumem_other")),
                        help=f"comma-separated, of {', '.join(MODES)} (floor needs nvcc; gpumem_other, a second library "
                             "or configuration file)")
    parser.add_argument("--other-library", metavar="PATH",
                        help="libgpumem.so of the second gpumem (mode gpumem_other), e.g. another build's")
    parser.add_argument("--other-config", metavar="FILE",
                        help="configuration file of the second gpumem (mode gpumem_other), given as GPUMEM_CONFIG")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per run")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed rounds, run one more under torch.profiler and report its busiest operators")
    parser.add_argument("--repeat", type=int, default=1, help="run the modes this many times in turn")
    parser.add_argument("--rounds", type=int, help="timed rounds in each run (default: the workload's, fewer with --quick)")
    parser.add_argument("--cpus", type=cpu_list, help="pin every run to these cores, e.g. 2-7 or 2,3,4")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--table", metavar="RESULTS_JSONL", help="print the table of an earlier run's results")
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.table:
        try:
            with open(args.table) as f:
                results = [json.loads(line) for line in f if line.strip()]
            tables = table(results) + "\n\n" + step_table(results)
        except OSError as e:
            parser.error(f"--table {args.table}: cannot read it ({e.strerror})")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            parser.error(f"--table {args.table}: not a results file of this script ({type(e).__name__}: {e})")
        return print(tables)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give 1 or more")
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)} (give {', '.join(MODES)})")
    if "gpumem_other" in args.modes.split(","):
        if not (args.other_library or args.other_config):
            parser.error("--modes gpumem_other: give --other-library PATH and/or --other-config FILE "
                         "(what the second gpumem differs in)")
        for flag, path in (("--other-library", args.other_library), ("--other-config", args.other_config)):
            if path and not os.path.isfile(path):
                parser.error(f"{flag} {path}: no such file")
    known = WORKLOADS + EXTRA_WORKLOADS + recorded_names()
    unknown = [w for w in args.workloads.split(",") if w not in known]
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)} (give {', '.join(known)})")
    results = []
    for workload in args.workloads.split(","):
        for mode in args.modes.split(",") * args.repeat:
            started = time.time()
            try:
                result = run_child(workload, mode, args)
            except subprocess.TimeoutExpired:
                result = {"workload": workload, "mode": mode, "error": f"timed out after {args.timeout} s"}
            result["process_seconds"] = round(time.time() - started, 1)
            per_step = ("outputs", "step_ms", "host_ms", "device_ms", "profile", "step_misses", "step_miss_ms",
                        "step_gpu_wait_ms")
            print(json.dumps({k: v for k, v in result.items() if k not in per_step}), flush=True)
            results.append(result)
            if os.environ.get("OUT"):  # everything, outputs included, in case the run is cut short
                with open(os.path.join(os.environ["OUT"], "results.jsonl"), "a") as f:
                    f.write(json.dumps(result) + "\n")
    print()
    print(table(results))
    print()
    print(step_table(results))


if __name__ == "__main__":
    main()
