# Replays allocation traces (benches/traces/README.md format) through PyTorch's CUDA caching
# allocator, so gpumem's `replay` figures have PyTorch's beside them, measured on the same GPU
# in the same run. Choose PyTorch's allocator settings with PYTORCH_CUDA_ALLOC_CONF, e.g.
#   ""                                   the default caching allocator
#   "expandable_segments:True"           PyTorch's virtual-memory segments
#   "backend:cudaMallocAsync"            the CUDA driver's stream-ordered pool
# usage: python3 torch_replay.py TRACE... ; prints one JSON line per trace.
import gzip, json, os, sys, time
import torch


def events(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rt") as lines:
        for line in lines:
            if line.startswith("#") or not line.strip():
                continue
            fields = line.split()
            if fields[0] == "a":
                yield True, int(fields[1]), int(fields[2])
            else:
                yield False, int(fields[1]), 0


def replay(path):
    trace = list(events(path))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    stream = torch.cuda.current_stream().cuda_stream
    live, requested, peak_requested = {}, 0, 0
    started = time.perf_counter_ns()
    for is_alloc, slot, size in trace:
        if is_alloc:
            live[slot] = (torch.cuda.caching_allocator_alloc(size, stream=stream), size)
            requested += size
            peak_requested = max(peak_requested, requested)
        else:
            ptr, size = live.pop(slot)
            torch.cuda.caching_allocator_delete(ptr)
            requested -= size
    torch.cuda.synchronize()
    elapsed = time.perf_counter_ns() - started
    for ptr, _ in live.values():
        torch.cuda.caching_allocator_delete(ptr)
    reserved = torch.cuda.max_memory_reserved()
    name = os.path.basename(path).split(".")[0]
    return dict(trace=name, allocator="pytorch", conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                events=len(trace), peak_requested_bytes=peak_requested, peak_reserved_bytes=reserved,
                reserved_over_peak=reserved / peak_requested if peak_requested else 0.0,
                ns_per_op=elapsed / max(len(trace), 1))


for path in sys.argv[1:]:
    print(json.dumps(replay(path)))
    sys.stdout.flush()
