# Is gpumem a drop-in for PyTorch's allocator? Every torch.cuda memory call, the graph and pool
# APIs, CUDA IPC and the memory paths of common libraries, run the same way under PyTorch's own
# allocator and under gpumem (gpumem.torch.use()), each check in a process of its own, and the
# compatibility table printed from the two (for docs/pytorch.md and docs/gpu-results.md).
#
# usage: python3 benches/gpu/torch_dropin.py [--library PATH] [--python-dir DIR] [--checks a,b]
#                                             [--modes default,gpumem] [--timeout S]
# Needs a GPU host with PyTorch (transformers, accelerate and lightning for their rows); builds
# nothing but gpumem's PyTorch layer (on first use, into $GPUMEM_TORCH_LAYER_DIR). Prints one
# JSON line per check and mode ("RESULT {...}"), then the table. A row reads "works" when the
# check passed, "works with a difference" when it passed and its figures differ from the
# default's (the detail says how), "does not work" when it raised or gave a wrong answer.
# Exit status: 0 when no check that works under PyTorch's allocator fails under gpumem.
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "RESULT "
MIB = 1 << 20


def setup(mode):
    import torch

    if mode == "gpumem":
        import gpumem.torch

        gpumem.torch.use()
        assert gpumem.torch.integration() == "layer", gpumem.torch.integration()
    torch.manual_seed(0)
    return torch


def mlp(torch, width=1024, depth=4):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).cuda()


def train_steps(torch, model, steps=5, batch=256, width=1024):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    generator = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(steps):
        x = torch.randn(batch, width, device="cuda", generator=generator)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses


# ----------------------------------------------------------------------------- the checks
def check_stats(torch, mode):
    """Every torch.cuda statistics call; figures of a fixed training run."""
    model = mlp(torch)
    torch.cuda.reset_peak_memory_stats()
    losses = train_steps(torch, model)
    stats = torch.cuda.memory_stats()
    figures = {
        "memory_allocated": torch.cuda.memory_allocated(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "requested_peak": stats.get("requested_bytes.all.peak"),
        "allocation_allocated": stats.get("allocation.all.allocated"),
    }
    summary = torch.cuda.memory_summary()
    nested = torch.cuda.memory_stats_as_nested_dict()
    torch.cuda.reset_accumulated_memory_stats()
    after_reset = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.reset_peak_memory_stats()
    peak_after_reset = torch.cuda.max_memory_allocated()
    free, total = torch.cuda.mem_get_info()
    return {
        "figures": figures,
        "keys": sorted(stats.keys()),
        "summary_lines": len(summary.splitlines()),
        "nested_groups": len(nested),
        "accumulated_after_reset": after_reset,
        "peak_reset_to_current": peak_after_reset == torch.cuda.memory_allocated(),
        "mem_get_info_ok": 0 < free <= total,
        "losses": losses,
    }


def check_oom(torch, mode):
    """100 refused allocations of growing sizes, each caught as OutOfMemoryError; then a
    training run that must give the same losses as without them."""
    total = torch.cuda.get_device_properties(0).total_memory
    caught, messages = 0, []
    for i in range(100):
        size = total + i * (total // 50)
        try:
            torch.empty(size, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as error:
            caught += 1
            if i in (0, 99):
                messages.append(str(error).splitlines()[0][:400])
    stats = torch.cuda.memory_stats()
    model = mlp(torch)
    losses = train_steps(torch, model)
    return {"caught": caught, "messages": messages, "num_ooms": stats.get("num_ooms"),
            "losses": losses, "ok": caught == 100}


def check_oom_snapshot(torch, mode):
    """The OOM flight recorder's PyTorch snapshot: under gpumem, gpumem.torch.publish(dir) writes
    the flight record (JSON) and PyTorch's snapshot (pickle) of a refusal into <dir>/oom; under
    PyTorch's allocator the same observer (gpumem.oom_snapshots) is attached by hand. The pickle
    must open in PyTorch's memory viewer code and show the blocks live at the refusal."""
    import pickle
    import tempfile

    from torch.cuda import _memory_viz

    import gpumem.oom_snapshots
    import gpumem.torch

    directory = tempfile.mkdtemp()
    oom_dir = os.path.join(directory, "oom")
    if mode == "gpumem":
        gpumem.torch.publish(directory)
    else:
        gpumem.oom_snapshots.attach(torch, oom_dir)
    torch.cuda.memory._record_memory_history(max_entries=10000)
    model = mlp(torch)
    train_steps(torch, model, steps=2)
    held = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    total = torch.cuda.get_device_properties(0).total_memory
    refused = 0
    for i in range(3):  # three refusals in a row: one snapshot (at most one every 10 s)
        try:
            torch.empty(total + i * MIB, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            refused += 1
    torch.cuda.memory._record_memory_history(enabled=None)
    deadline = time.time() + 5  # the publisher writes its record after its next sample
    names = []
    while time.time() < deadline:
        names = sorted(os.listdir(oom_dir)) if os.path.isdir(oom_dir) else []
        if any(n.endswith(".pickle") for n in names) and (
                mode != "gpumem" or any(n.endswith(".json") for n in names)):
            break
        time.sleep(0.2)
    pickles = [n for n in names if n.endswith(".pickle")]
    records = [n for n in names if n.endswith(".json")]
    result = {"refused": refused, "pickles": pickles, "records": records}
    if pickles:
        with open(os.path.join(oom_dir, pickles[0]), "rb") as f:
            snapshot = pickle.load(f)
        segments = snapshot["segments"]
        live = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
        viewer = [_memory_viz.segsum(snapshot), _memory_viz.trace(snapshot),
                  _memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)]
        result.update({
            "snapshot_bytes": os.path.getsize(os.path.join(oom_dir, pickles[0])),
            "segments": len(segments), "held_block_seen": 64 * MIB in live,
            "trace_entries": len(snapshot["device_traces"][0]),
            "oom_in_trace": any(e["action"] == "oom" for e in snapshot["device_traces"][0]),
            "viewer_output_chars": [len(v) for v in viewer],
        })
    del held
    result["ok"] = (refused == 3 and len(pickles) == 1 and result.get("held_block_seen", False)
                    and (mode != "gpumem" or len(records) >= 1))
    return result


def check_empty_cache(torch, mode):
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    reserved_before = torch.cuda.memory_reserved()
    free_before, _ = torch.cuda.mem_get_info()
    torch.cuda.empty_cache()
    reserved_after = torch.cuda.memory_reserved()
    free_after, _ = torch.cuda.mem_get_info()
    released = reserved_before - reserved_after
    return {"released_mib": released // MIB, "driver_free_gain_mib": (free_after - free_before) // MIB,
            "ok": released >= (1 << 30) and free_after - free_before >= (1 << 29)}


def check_memory_fraction(torch, mode):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.25)
    fraction = torch.cuda.get_per_process_memory_fraction() if hasattr(
        torch.cuda, "get_per_process_memory_fraction") else None
    small = torch.empty(int(total * 0.15), dtype=torch.uint8, device="cuda")
    refused = False
    try:
        torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        refused = True
    del small
    return {"fraction_read": fraction, "over_fraction_refused": refused, "ok": refused}


def check_env_fraction(torch, mode):
    total = torch.cuda.get_device_properties(0).total_memory
    refused = False
    try:
        torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        refused = True
    return {"over_fraction_refused": refused, "ok": refused}


STACKS = {"snapshot_python_stacks": "python", "snapshot_no_context": "python"}
CONTEXT = {"snapshot_no_context": None}
check_name = ""


def check_snapshot(torch, mode):
    """_record_memory_history, _snapshot, _dump_snapshot, and PyTorch's memory viewer code: its
    text views, and the HTML pages of trace_plot and segment_plot (which load the viewer's script
    from the web when opened in a browser)."""
    import tempfile

    from torch.cuda import _memory_viz

    torch.cuda.memory._record_memory_history(max_entries=100000, stacks=STACKS.get(check_name, "all"),
                                             context=CONTEXT.get(check_name, "all"))
    model = mlp(torch)
    train_steps(torch, model, steps=2)
    snapshot = torch.cuda.memory._snapshot()
    path = os.path.join(tempfile.mkdtemp(), "snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    traces = snapshot["device_traces"][0]
    actions = sorted({entry["action"] for entry in traces})
    framed = sum(1 for entry in traces if entry.get("frames"))
    segments = snapshot["segments"]
    allocated = sum(block["size"] for s in segments for block in s["blocks"]
                    if block["state"] == "active_allocated")
    # memory() and segments() pipe their lines through flamegraph.pl, which they download;
    # the lines themselves are the viewer's reading of the snapshot.
    lines = lambda text: text  # noqa: E731
    viewer = [_memory_viz.memory(snapshot, format_flamegraph=lines),
              _memory_viz.segments(snapshot, format_flamegraph=lines),
              _memory_viz.segsum(snapshot), _memory_viz.trace(snapshot),
              _memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)]
    with open(path, "rb") as dumped:
        import pickle

        reloaded = pickle.load(dumped)
    viewer.append(_memory_viz.segsum(reloaded))
    return {
        "segments": len(segments),
        "blocks": sum(len(s["blocks"]) for s in segments),
        "allocated_in_snapshot_mib": allocated / MIB,
        "memory_allocated_mib": torch.cuda.memory_allocated() / MIB,
        "trace_entries": len(traces),
        "actions": actions,
        "entries_with_frames": framed,
        "viewer_output_chars": [len(text) for text in viewer],
        "dumped_bytes": os.path.getsize(path),
        "ok": len(traces) > 0 and len(segments) > 0 and (framed > 0 or check_name in CONTEXT),
    }


def check_graphs(torch, mode):
    """torch.cuda.graph with a shared pool, and make_graphed_callables: outputs equal eager."""
    model = mlp(torch, width=512, depth=3).eval()
    static_in = torch.randn(64, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(g1):
            out1 = model(static_in)
        with torch.cuda.graph(g2, pool=g1.pool()):
            out2 = model(static_in * 2)
    diffs = []
    for _ in range(5):
        x = torch.randn(64, 512, device="cuda")
        static_in.copy_(x)
        g1.replay()
        g2.replay()
        with torch.no_grad():
            diffs.append(float((out1 - model(x)).abs().max()))
            diffs.append(float((out2 - model(x * 2)).abs().max()))
    train_model = mlp(torch, width=256, depth=2)
    sample = torch.randn(32, 256, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(train_model, (sample,))
    y = graphed(torch.randn(32, 256, device="cuda", requires_grad=True))
    y.sum().backward()
    del g1, g2, out1, out2
    return {"max_difference": max(diffs), "graphed_callable_ok": True, "ok": max(diffs) == 0.0}


def check_mempool(torch, mode):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.ones(4 * MIB, device="cuda")
        b = torch.ones(1000, device="cuda")
    c = torch.ones(1000, device="cuda")
    in_pool = pool.snapshot()
    use_count = pool.use_count()
    total = float(a.sum() + b.sum() + c.sum())
    pool_bytes = sum(s["total_size"] for s in in_pool)
    del a, b
    return {"pool_segments": len(in_pool), "pool_bytes": pool_bytes, "use_count": use_count,
            "sum": total, "ok": len(in_pool) > 0 and total == 4 * MIB + 2000}


def check_compile(torch, mode):
    """torch.compile(mode="reduce-overhead"): CUDA-graph trees, training and inference."""
    model = mlp(torch, width=256, depth=3)
    compiled = torch.compile(model, mode="reduce-overhead")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    generator = torch.Generator(device="cuda").manual_seed(3)
    losses = []
    for _ in range(6):
        x = torch.randn(64, 256, device="cuda", generator=generator)
        loss = compiled(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
    infer = torch.compile(mlp(torch, width=256, depth=2).eval(), mode="reduce-overhead")
    diffs = []
    with torch.no_grad():
        for batch in (8, 16, 8, 32, 16):
            x = torch.randn(batch, 256, device="cuda")
            diffs.append(float((infer(x) - infer._orig_mod(x)).abs().max()))
    return {"losses": losses, "inference_max_difference": max(diffs), "ok": max(diffs) < 1e-3}


def _ipc_receiver(receiver_mode, queue, done):
    torch = setup(receiver_mode)
    while True:
        tensor = queue.get()
        if tensor is None:
            break
        total = float(tensor.sum())
        tensor.add_(1)  # the sender must see this: the memory is shared, not copied
        torch.cuda.synchronize()
        done.put(total)
        del tensor


# 4 KiB and 4 MiB lie on one chunk of gpumem's; 66 MiB and 300 MiB on chunks of several sizes,
# which the sender re-backs with pages of one size before it can describe them to PyTorch.
IPC_ELEMENTS = {"4KiB": 1024, "4MiB": 1024 * 1024, "66MiB": 33 * MIB // 2, "300MiB": 75 * MIB}


def check_ipc(torch, mode):
    """Tensors sent to a process under each allocator: each arrives with its values, and the
    receiver's writes reach the sender (shared memory, not a copy)."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor

    context = mp.get_context("spawn")
    out, ok = {}, True
    for receiver_mode in ("default", "gpumem"):
        queue, done = context.Queue(), context.Queue()
        receiver = context.Process(target=_ipc_receiver, args=(receiver_mode, queue, done),
                                   daemon=True)
        receiver.start()
        sent = []
        for name, elements in IPC_ELEMENTS.items():
            neighbour = torch.full((elements // 3 + 1,), 5.0, device="cuda")
            tensor = torch.full((elements,), 2.0, device="cuda")
            reduce_tensor(tensor)  # what the queue's pickler calls: raises here if refused
            queue.put(tensor)
            total = done.get(timeout=120)
            torch.cuda.synchronize()
            result = {"received_sum": total, "sum_expected": 2.0 * elements,
                      "receiver_write_seen": bool((tensor == 3.0).all()),
                      "neighbour_intact": bool((neighbour == 5.0).all())}
            result["ok"] = (total == 2.0 * elements and result["receiver_write_seen"]
                            and result["neighbour_intact"])
            ok = ok and result["ok"]
            out[f"to_{receiver_mode}_{name}"] = result
            sent.append((tensor, neighbour))  # alive until the receiver has let go
        queue.put(None)
        receiver.join(60)
    return {**out, "ok": ok}


def check_profiler(torch, mode):
    from torch.profiler import ProfilerActivity, profile

    model = mlp(torch, width=512, depth=2)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
        train_steps(torch, model, steps=2, width=512)
    events = prof.key_averages()
    cuda_memory = sum(abs(getattr(e, "device_memory_usage", getattr(e, "cuda_memory_usage", 0)))
                      for e in events)
    return {"events": len(events), "device_memory_usage_total": cuda_memory, "ok": cuda_memory > 0}


def check_record_stream(torch, mode):
    side = torch.cuda.Stream()
    wrong = 0
    for _ in range(10):
        x = torch.ones(16 * MIB, device="cuda")
        big = torch.randn(4096, 4096, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(10):
                big = big @ big / 4096
            total = x.sum()
        x.record_stream(side)
        del x
        y = torch.zeros(16 * MIB, device="cuda")
        side.synchronize()
        wrong += int(float(total) != 16 * MIB)
        del y
    return {"wrong_sums": wrong, "ok": wrong == 0}


def check_trainer(torch, mode):
    """transformers Trainer: skip_memory_metrics=False and auto_find_batch_size=True."""
    import tempfile

    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 1000, (64, 128))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=16,
                             num_train_epochs=1, skip_memory_metrics=False,
                             auto_find_batch_size=True, report_to=[], logging_steps=1,
                             save_strategy="no", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    metrics = trainer.train().metrics
    memory_keys = sorted(k for k in metrics if "mem" in k)
    return {"memory_metrics": {k: metrics[k] for k in memory_keys},
            "ok": any("gpu" in k for k in memory_keys)}


def check_accelerate(torch, mode):
    """accelerate's find_executable_batch_size: real OOMs until the batch fits."""
    from accelerate.utils import find_executable_batch_size

    total = torch.cuda.get_device_properties(0).total_memory
    tried = []

    @find_executable_batch_size(starting_batch_size=1024)
    def run(batch_size):
        tried.append(batch_size)
        # Needs batch_size/64 of the device: refused from 64 up, fits somewhere below.
        x = torch.empty(int(total * batch_size / 64), dtype=torch.uint8, device="cuda")
        x.fill_(0)
        return batch_size

    chosen = run()
    return {"tried": tried, "chosen": chosen, "ok": 0 < chosen < 64 and len(tried) > 1}


def check_ddp(torch, mode):
    """DDP over NCCL, one process on this GPU."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(mlp(torch, width=512, depth=2))
    losses = train_steps(torch, model, steps=3, width=512)
    tensor = torch.ones(1024, device="cuda")
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    return {"losses": losses, "all_reduce_sum": float(tensor.sum()), "ok": float(tensor.sum()) == 1024}


def check_lightning(torch, mode):
    """Lightning's DeviceStatsMonitor, which logs torch.cuda.memory_stats() every step."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import DeviceStatsMonitor

    logged = {}

    class Capture(pl.loggers.logger.Logger):
        name, version = "capture", "0"

        @property
        def experiment(self):
            return None

        def log_hyperparams(self, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            logged.update(metrics)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(64, 64)

        def training_step(self, batch, index):
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.randn(64, 64), batch_size=16)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=3, logger=Capture(),
                         callbacks=[DeviceStatsMonitor()], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(Module(), data)
    keys = [k for k in logged if "allocated_bytes" in k]
    return {"memory_keys_logged": len(keys), "ok": len(keys) > 0}


def check_alloc_cost(torch, mode):
    """torch.empty + free of a cached size, nanoseconds a pair (median of 7 runs of 20,000)."""
    sizes = {"4KiB": 1024, "1MiB": 256 * 1024, "64MiB": 16 * MIB}
    out = {}
    for name, elements in sizes.items():
        runs = []
        torch.empty(elements, device="cuda")
        for _ in range(7):
            start = time.perf_counter_ns()
            for _ in range(20000):
                torch.empty(elements, device="cuda")
            runs.append((time.perf_counter_ns() - start) / 20000)
        runs.sort()
        out[name] = runs[len(runs) // 2]
    return {"ns_per_pair": out, "ok": True}


CHECKS = {
    "stats": check_stats, "oom": check_oom, "oom_snapshot": check_oom_snapshot,
    "empty_cache": check_empty_cache,
    "memory_fraction": check_memory_fraction, "env_fraction": check_env_fraction,
    "snapshot": check_snapshot, "snapshot_python_stacks": check_snapshot,
    "snapshot_no_context": check_snapshot, "graphs": check_graphs, "mempool": check_mempool,
    "compile_reduce_overhead": check_compile, "ipc": check_ipc, "profiler": check_profiler,
    "record_stream": check_record_stream, "trainer": check_trainer,
    "accelerate": check_accelerate, "ddp": check_ddp, "lightning": check_lightning,
    "alloc_cost": check_alloc_cost,
}
ENVIRONMENT = {"env_fraction": {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.25"}}


def child(check, mode):
    global check_name
    check_name = check
    import faulthandler

    faulthandler.enable()
    started = time.time()
    result = {"check": check, "mode": mode}
    try:
        torch = setup(mode)
        result.update(CHECKS[check](torch, mode))
        result["status"] = "works" if result.pop("ok", True) else "wrong"
    except BaseException as error:  # noqa: BLE001 - every failure is a row of the table
        result["status"] = "raises"
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    result["seconds"] = round(time.time() - started, 1)
    print(MARK + json.dumps(result, default=str), flush=True)


def run(check, mode, args):
    env = dict(os.environ)
    env.update(ENVIRONMENT.get(check, {}))
    if args.library:
        env["GPUMEM_LIBRARY"] = os.path.abspath(args.library)
    if args.python_dir:
        env["PYTHONPATH"] = os.path.abspath(args.python_dir) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, os.path.abspath(__file__), "--child", check, "--mode", mode]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"check": check, "mode": mode, "status": "raises", "error": f"timed out after {args.timeout}s"}
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    if done.returncode < 0 and os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"stderr-{check}-{mode}.txt"), "w") as out:
            out.write(done.stderr[-200000:])
    if done.returncode < 0 and os.environ.get("OUT") and shutil.which("gdb"):
        # A crash: where, in C++, for the record.
        trace = subprocess.run(["gdb", "-batch", "-ex", "run", "-ex", "bt 40", "--args"] + command,
                               env=env, capture_output=True, text=True, timeout=args.timeout)
        with open(os.path.join(os.environ["OUT"], f"crash-{check}-{mode}.txt"), "w") as out:
            out.write(trace.stdout[-60000:] + trace.stderr[-20000:])
    return {"check": check, "mode": mode, "status": "raises",
            "error": f"exit {done.returncode}: {tail[:300]}"}


def row(check, results):
    base, ours = results.get((check, "default")), results.get((check, "gpumem"))
    if ours is None:
        return None
    verdict = {"works": "works", "wrong": "does not work (wrong result)",
               "raises": "does not work"}[ours["status"]]
    detail = ours.get("error", "")
    if "keys" in ours and base and "keys" in base and ours["keys"] != base["keys"]:
        missing = sorted(set(base["keys"]) - set(ours["keys"]))
        verdict, detail = "works with a difference", f"keys missing: {missing}"
    elif ours["status"] == "works" and base and base["status"] == "works":
        if "ns_per_pair" in ours:
            detail = "ns a pair, gpumem / default: " + ", ".join(
                f"{size} {ours['ns_per_pair'][size]:.0f} / {base['ns_per_pair'][size]:.0f}"
                for size in ours["ns_per_pair"])
        if "keys" in ours:
            detail = f"{len(ours['keys'])} keys, the same as the default's"
        for key in ("losses", "figures", "max_difference", "inference_max_difference", "chosen"):
            if key in ours and ours[key] != base.get(key):
                verdict = "works with a difference"
                detail = f"{key}: {ours[key]} (default {base.get(key)})"
                break
    base_status = base["status"] if base else "-"
    return f"| {check} | {base_status} | {verdict} | {detail} |"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child")
    parser.add_argument("--mode", default="gpumem")
    parser.add_argument("--modes", default="default,gpumem")
    parser.add_argument("--checks", default=",".join(CHECKS))
    parser.add_argument("--library")
    parser.add_argument("--python-dir")
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.mode)
        return 0
    checks = args.checks.split(",")
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        print(f"unknown checks: {', '.join(unknown)} (known: {', '.join(CHECKS)})", file=sys.stderr)
        return 2
    results = {}
    for check in checks:
        for mode in args.modes.split(","):
            result = run(check, mode, args)
            results[(check, mode)] = result
            print(MARK + json.dumps(result, default=str), flush=True)
    print("\n| call or library | PyTorch's allocator | gpumem | detail |\n| --- | --- | --- | --- |")
    regressions = 0
    for check in checks:
        line = row(check, results)
        if line:
            print(line)
        base, ours = results.get((check, "default")), results.get((check, "gpumem"))
        if base and ours and base["status"] == "works" and ours["status"] != "works":
            regressions += 1
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
