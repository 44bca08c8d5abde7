# CUDA graphs with gpumem as PyTorch's allocator: capture (with allocations, so the first ones
# map pages mid-capture), replay, pools shared between graphs, memory released with the last
# graph, and torch.compile's "reduce-overhead" mode. Each case runs in its own process under the
# default allocator and under gpumem, and prints a checksum of what it computed: the two must
# agree to the bit.
#
# usage: python3 benches/gpu/torch_graphs.py [--library PATH] [--python-dir DIR] [--cases a,b]
# Prints one JSON line per case and allocator: exit code, the case's own JSON result (last line).
import json
import subprocess
import sys

import case_env

PRELUDE = """
import gc, hashlib, json, os, sys, torch
USE_GPUMEM = os.environ.get("CASE_ALLOCATOR") == "gpumem"
if USE_GPUMEM:
    import gpumem.torch as gt
    gt.use()
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
result = {}
def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
def graph_stats():
    if not USE_GPUMEM:
        return {}
    s = gt.memory_stats(0)
    return {k: s[k] for k in ("graph_pools.current", "graph_pool_reserved_bytes.current",
                              "graph_pool_allocated_bytes.current", "reserved_bytes.all.current")}
"""

CASES = {
    # A transformer layer captured whole: replays must equal eager runs, and eager tensors made
    # after the capture must survive replays (they would not if they reused memory the graph
    # freed during capture and still writes on every replay).
    "encoder_layer": """
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True).cuda().eval()
static_in = torch.randn(8, 128, 512, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side), torch.no_grad():
    for _ in range(3):
        layer(static_in)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(graph):
    static_out = layer(static_in)
result["during_capture"] = graph_stats()
bystanders = [torch.full((n << 18,), float(n), device="cuda") for n in range(1, 41)]
outputs, worst = [], 0.0
for step in range(5):
    static_in.copy_(torch.randn(8, 128, 512, device="cuda"))
    graph.replay()
    with torch.no_grad():
        eager = layer(static_in)
    worst = max(worst, float((static_out - eager).abs().max()))
    outputs.append(static_out.clone())
torch.cuda.synchronize()
result["bystanders_intact"] = all(bool((t == n).all()) for n, t in zip(range(1, 41), bystanders))
result["replay_vs_eager_max_abs_diff"] = worst
result["digest"] = digest(outputs)
""",
    # Two graphs sharing one pool (as vLLM captures its batch sizes), replayed in capture order;
    # then both deleted: the pool's memory must go back.
    "shared_pool": """
mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
graphs, ins, outs = [], [], []
pool = None
for batch in (64, 16):
    x = torch.randn(batch, 1024, device="cuda")
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        mlp(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g, pool=pool):
        y = mlp(x)
    pool = g.pool()
    graphs.append(g); ins.append(x); outs.append(y)
result["after_capture"] = graph_stats()
checks = []
for step in range(4):
    for g, x, y in zip(graphs, ins, outs):
        x.copy_(torch.randn_like(x)); g.replay()
        with torch.no_grad():
            checks.append(bool(torch.equal(y, mlp(x))))
result["replays_equal_eager"] = all(checks)
result["digest"] = digest(outs)
del graphs, g, outs, y
gc.collect(); torch.cuda.synchronize()
result["after_delete"] = graph_stats()
""",
    # A training step captured whole (forward, backward, optimizer), the PyTorch docs' recipe.
    "train_step": """
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.CrossEntropyLoss()
static_x = torch.randn(64, 256, device="cuda"); static_y = torch.randint(0, 10, (64,), device="cuda")
side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(static_x), static_y).backward()
        opt.step()
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph()
opt.zero_grad(set_to_none=True)
with torch.cuda.graph(g):
    static_loss = loss_fn(model(static_x), static_y)
    static_loss.backward()
    opt.step()
losses = []
gen = torch.Generator(device="cuda").manual_seed(1)
for step in range(20):
    static_x.copy_(torch.randn(64, 256, device="cuda", generator=gen))
    static_y.copy_(torch.randint(0, 10, (64,), device="cuda", generator=gen))
    g.replay()
    losses.append(static_loss.clone())
torch.cuda.synchronize()
result["first_last_loss"] = [float(losses[0]), float(losses[-1])]
result["digest"] = digest(losses)
result["graph"] = graph_stats()
""",
    "compile_reduce_overhead": """
def f(x, w):
    return torch.nn.functional.gelu(x @ w).sum(dim=-1)
compiled = torch.compile(f, mode="reduce-overhead")
w = torch.randn(512, 512, device="cuda")
outs = []
for step in range(6):
    x = torch.randn(32, 512, device="cuda")
    outs.append(compiled(x, w).clone())
torch.cuda.synchronize()
result["digest"] = digest(outs)
result["graph"] = graph_stats()
""",
}

EPILOGUE = """
print(json.dumps(result))
"""


def run(name, allocator, env):
    code = PRELUDE + CASES[name] + EPILOGUE
    case_env = dict(env, CASE_ALLOCATOR=allocator)
    try:
        done = subprocess.run([sys.executable, "-c", code], env=case_env, capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"case": name, "allocator": allocator, "exit": None, "output": ["timed out"]}
    lines = (done.stdout + done.stderr).strip().splitlines()
    row = {"case": name, "allocator": allocator, "exit": done.returncode}
    try:
        row["result"] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        row["output"] = lines[-12:]
    return row


def main():
    args = case_env.parse_args(__doc__)
    env = case_env.child_env(args)
    for name in args.cases.split(",") if args.cases else list(CASES):
        rows = [run(name, allocator, env) for allocator in ("default", "gpumem")]
        digests = [row.get("result", {}).get("digest") for row in rows]
        for row in rows:
            print(json.dumps(row), flush=True)
        print(json.dumps({"case": name, "identical": digests[0] is not None and digests[0] == digests[1]}),
              flush=True)


if __name__ == "__main__":
    main()
