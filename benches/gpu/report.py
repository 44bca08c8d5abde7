# Turns the raw results of benches/gpu/run.sh into the Markdown tables of docs/performance.md.
# usage: python3 report.py OUT_DIR > report.md
import json, os, re, sys
from collections import defaultdict

from byte_sizes import size_name as size

out = sys.argv[1]


def lines(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    rows = []
    for line in open(path):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def ns(v):
    return f"{v / 1000:.1f} µs" if v >= 10_000 else f"{v:.0f} ns"


smi = open(os.path.join(out, "nvidia-smi.csv")).read().strip().splitlines()
print(f"Device: {smi[-1] if smi else 'unknown'}\n")

bench = lines("bench.jsonl")
if bench:
    print("### Allocation speed: alloc + free pair, median / p99 (for gpumem's misses, the mean time inside driver calls)\n")
    sizes = sorted({r["size_bytes"] for r in bench})
    print("| allocator | threads | " + " | ".join(size(s) for s in sizes) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in sizes) + " |")
    cells = defaultdict(dict)
    for r in bench:
        in_driver = r.get("driver_ns_per_pair") or 0
        driver = f" (driver {ns(in_driver)})" if in_driver > 0 else ""
        cells[(r["allocator"], r["threads"])][r["size_bytes"]] = f"{ns(r['median_ns'])} / {ns(r['p99_ns'])}{driver}"
    for (allocator, threads), row in sorted(cells.items()):
        print(f"| {allocator} | {threads} | " + " | ".join(row.get(s, "") for s in sizes) + " |")
    print()

gpumem = {r["trace"]: r for r in lines("replay-gpumem.jsonl")}
driver_pool = {r["trace"]: r for r in lines("replay-driver-pool.jsonl")}
held_out = {"vit_train", "moe_generate", "longctx_generate"}
torch = defaultdict(dict)
for r in lines("replay-torch.jsonl"):
    torch[r["trace"]][r["conf"] or "default"] = r
if gpumem:
    print("### Reserved over peak requested on real traces (lower is better, 1.000 is the floor)\n")
    print("Held-out traces (never used to choose a default) are marked †.\n")
    print("| trace | gpumem | gpumem ns/op (in driver calls) | driver pool, same run | driver pool ns/op | misses | miss p50 / p99 | pages created / reused | PyTorch default | PyTorch expandable_segments | PyTorch cudaMallocAsync | gpumem vs driver accounting gap |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in sorted(gpumem.items(), key=lambda item: (item[0] in held_out, item[0])):
        t = torch.get(name, {})
        d = driver_pool.get(name)
        pick = lambda conf: f"{t[conf]['reserved_over_peak']:.3f}" if conf in t else "n/a"
        mark = " †" if name in held_out else ""
        misses = r.get("misses", "n/a")
        miss = f"{ns(r['miss_p50_ns'])} / {ns(r['miss_p99_ns'])}" if "miss_p50_ns" in r else "n/a"
        pages = f"{r['pages_created']} / {r['pages_reused']}" if "pages_created" in r else "n/a"
        baseline = f"{d['reserved_over_peak']:.3f} | {d['ns_per_op']:.0f}" if d else "n/a | n/a"
        in_driver = f" ({r['driver_ns_per_op']:.0f})" if r.get("driver_ns_per_op") is not None else ""
        print(f"| {name}{mark} | **{r['reserved_over_peak']:.3f}** | {r['ns_per_op']:.0f}{in_driver} | {baseline} | "
              f"{misses} | {miss} | {pages} | {pick('default')} | "
              f"{pick('expandable_segments:True')} | {pick('backend:cudaMallocAsync')} | {r['max_device_vs_reserved_gap_bytes']} B |")
    print()

truth_path = os.path.join(out, "truthfulness.json")
if os.path.exists(truth_path):
    truth = json.load(open(truth_path))
    print("### Truthfulness: gpumem against nvidia-smi, GPU held steady by a PyTorch process (MiB)\n")
    for flag in ("name_and_uuid_match", "serve_has_no_context", "steady", "steady_during_scrape"):
        if flag in truth:
            print(f"- {flag.replace('_', ' ')}: {'yes' if truth[flag] else 'NO'}")
    print()
    print("| check | gpumem | nvidia-smi | tolerance | |")
    print("| --- | --- | --- | --- | --- |")
    for c in truth["checks"]:
        fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)
        print(f"| {c['what']} | {fmt(c['gpumem'])} | {fmt(c['nvidia_smi'])} | {c['tolerance']} | {'ok' if c['ok'] else 'DIFFERS'} |")
    print()

scrape = os.path.join(out, "scrape.log")
if os.path.exists(scrape):
    print("### Exporter cost (criterion medians)\n")
    text = open(scrape).read()
    for name, value, unit in re.findall(r"^(\S+)\s*\n?\s*time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", text, re.M):
        print(f"- `{name}`: {value} {unit}")
    print()
