# Checks that what gpumem reports agrees with the driver: runs `gpumem demo` on the CUDA backend,
# and while it runs compares `gpumem devices --json`, the demo's /metrics and (when present)
# `gpumem serve` (NVML) with nvidia-smi: total, used, free and per-process memory.
# usage: python3 truthfulness.py GPUMEM_BINARY OUT_DIR ; writes OUT_DIR/truthfulness.json
import json, os, re, subprocess, sys, time, urllib.request

gpumem, out = sys.argv[1], sys.argv[2]
MIB = 1 << 20
GRANULE = 2 * MIB


def smi(query, kind="gpu"):
    flag = "--query-gpu" if kind == "gpu" else "--query-compute-apps"
    text = subprocess.run(["nvidia-smi", f"{flag}={query}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout
    return [[f.strip() for f in line.split(",")] for line in text.strip().splitlines() if line.strip()]


def scrape(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        match = re.match(r'^(\w+)(\{[^}]*\})?\s+(\S+)$', line)
        if match:
            values.setdefault(match.group(1), []).append((match.group(2) or "", float(match.group(3))))
    return values


def first(values, name, label=""):
    for labels, value in values.get(name, []):
        if label in labels:
            return value
    return None


result = {"checks": []}


def check(what, ours, theirs, tolerance):
    ok = ours is not None and theirs is not None and abs(ours - theirs) <= tolerance
    result["checks"].append(dict(what=what, gpumem=ours, nvidia_smi=theirs, tolerance=tolerance, ok=ok))
    print(f"{'OK ' if ok else 'BAD'} {what}: gpumem {ours} vs nvidia-smi {theirs} (tolerance {tolerance})")


demo = subprocess.Popen([gpumem, "demo", "--backend", "cuda", "--devices", "0", "--listen", "127.0.0.1:9411",
                         "--interval", "500ms", "--duration", "60s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
serve = None
try:
    time.sleep(12)
    metrics = scrape("http://127.0.0.1:9411/metrics")
    gpu = smi("index,memory.total,memory.used,memory.free")[0]
    devices = json.loads(subprocess.run([gpumem, "devices", "--backend", "cuda", "--devices", "0", "--json"],
                                        capture_output=True, text=True).stdout)[0]
    total_mib, used_mib, free_mib = (float(x) for x in gpu[1:4])
    # nvidia-smi's total counts memory the driver keeps for itself; free agrees with cuMemGetInfo.
    check("free bytes (devices --json, MiB)", devices["free_bytes"] / MIB, free_mib, 16)
    check("free bytes (/metrics, MiB)", first(metrics, "gpumem_device_memory_free_bytes", 'gpu="0"') / MIB, free_mib, 64)
    check("used + free = total (/metrics vs nvidia-smi used+free, MiB)",
          (first(metrics, "gpumem_device_memory_used_bytes", 'gpu="0"') + first(metrics, "gpumem_device_memory_free_bytes", 'gpu="0"')) / MIB,
          used_mib + free_mib, 700)
    apps = {int(row[0]): float(row[1]) for row in smi("pid,used_memory", "apps") if row[0].isdigit()}
    demo_used = apps.get(demo.pid)
    reserved = first(metrics, "gpumem_reserved_bytes", 'gpu="0"')
    # The process's use is its pools plus its CUDA context (~500 MiB) and ballast it holds.
    result["demo_process_mib"] = demo_used
    result["demo_reserved_mib"] = reserved / MIB if reserved is not None else None
    print(f"demo process per nvidia-smi: {demo_used} MiB; gpumem reserved: {result['demo_reserved_mib']} MiB")
    help_text = subprocess.run([gpumem, "--help"], capture_output=True, text=True).stdout
    if " serve " in help_text or "\n  serve" in help_text:
        serve = subprocess.Popen([gpumem, "serve", "--listen", "127.0.0.1:9412", "--interval", "500ms"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(4)
        served = scrape("http://127.0.0.1:9412/metrics")
        check("sidecar free (NVML, MiB)", (first(served, "gpumem_device_memory_free_bytes", 'gpu="0"') or 0) / MIB,
              float(smi("memory.free")[0][0]), 64)
        per_process = [v for labels, v in served.get("gpumem_process_used_bytes", []) if f'pid="{demo.pid}"' in labels]
        check("sidecar per-process used for the demo (NVML, MiB)",
              per_process[0] / MIB if per_process else None, float(smi("pid,used_memory", "apps") and
              {int(r[0]): float(r[1]) for r in smi("pid,used_memory", "apps")}.get(demo.pid, 0)), 4)
finally:
    for process in (serve, demo):
        if process:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
json.dump(result, open(os.path.join(out, "truthfulness.json"), "w"), indent=1)
