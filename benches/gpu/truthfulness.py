# Checks that what gpumem reports agrees with the driver and with nvidia-smi, on a GPU whose
# memory is held steady (a PyTorch process holding a fixed amount), so that readings taken a
# moment apart can be compared: `gpumem devices --json` (cuMemGetInfo) and `gpumem serve` (NVML,
# device and per-process) against nvidia-smi, within the driver's 2 MiB granularity.
# usage: python3 truthfulness.py GPUMEM_BINARY OUT_DIR ; writes OUT_DIR/truthfulness.json
import json, os, re, subprocess, sys, time, urllib.request

gpumem, out = sys.argv[1], sys.argv[2]
MIB = 1 << 20
HOLDER = """
import sys, time, torch
x = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)
"""


def smi(query, apps=False):
    flag = "--query-compute-apps" if apps else "--query-gpu"
    text = subprocess.run(["nvidia-smi", f"{flag}={query}", "--format=csv,noheader,nounits", "-i", "0"],
                          capture_output=True, text=True).stdout
    return [[f.strip() for f in line.split(",")] for line in text.strip().splitlines() if line.strip()]


def smi_free_used():
    free, used = smi("memory.free,memory.used")[0]
    return float(free), float(used)


def scrape(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        match = re.match(r'^(\w+)(\{[^}]*\})?\s+(\S+)$', line)
        if match:
            values.setdefault(match.group(1), []).append((match.group(2) or "", float(match.group(3))))
    return values


def first(values, name, label):
    return next((v for labels, v in values.get(name, []) if label in labels), None)


result = {"checks": []}


def check(what, ours, theirs, tolerance):
    ok = ours is not None and theirs is not None and abs(ours - theirs) <= tolerance
    result["checks"].append(dict(what=what, gpumem=ours, nvidia_smi=theirs, tolerance=tolerance, ok=ok))
    print(f"{'OK ' if ok else 'BAD'} {what}: gpumem {ours} vs nvidia-smi {theirs} (tolerance {tolerance} MiB)")


holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
serve = None
try:
    holder.stdout.readline()
    time.sleep(1)
    before = smi_free_used()
    devices = json.loads(subprocess.run([gpumem, "devices", "--backend", "cuda", "--devices", "0", "--json"],
                                        capture_output=True, text=True).stdout)[0]
    after = smi_free_used()
    result["steady"] = before == after
    name, uuid = smi("name,uuid")[0]
    result["name_and_uuid_match"] = (devices["name"], devices["uuid"]) == (name, uuid)
    print(f"{'OK ' if result['name_and_uuid_match'] else 'BAD'} name and uuid: {devices['name']} {devices['uuid']} vs {name} {uuid}")
    check("device total, `gpumem devices --json` (cuMemGetInfo) vs nvidia-smi used + free",
          devices["total_memory_bytes"] / MIB, before[0] + before[1], 2)
    serve = subprocess.Popen([gpumem, "serve", "--listen", "127.0.0.1:9412", "--interval", "500ms"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    first_read = smi_free_used()
    served = scrape("http://127.0.0.1:9412/metrics")
    free_now, used_now = smi_free_used()
    result["steady_during_scrape"] = first_read == (free_now, used_now)
    check("device free, `gpumem serve` (NVML)", first(served, "gpumem_device_memory_free_bytes", 'gpu="0"') / MIB, free_now, 2)
    check("device used, `gpumem serve` (NVML)", first(served, "gpumem_device_memory_used_bytes", 'gpu="0"') / MIB, used_now, 2)
    apps = {int(row[0]): float(row[1]) for row in smi("pid,used_memory", apps=True) if row[0].isdigit()}
    per_process = next((v for labels, v in served.get("gpumem_process_used_bytes", []) if f'pid="{holder.pid}"' in labels), None)
    check("per-process used of a PyTorch process holding 3 GiB, `gpumem serve` (NVML)",
          per_process / MIB if per_process is not None else None, apps.get(holder.pid), 2)
    result["serve_has_no_context"] = serve.pid not in apps
    print(f"{'OK ' if result['serve_has_no_context'] else 'BAD'} gpumem serve holds no CUDA context "
          f"(not among nvidia-smi's compute processes: {sorted(apps)})")
    serve.terminate()
    serve.wait(10)
    # Without NVML, with a context allowed: device memory through cuMemGetInfo, the path the
    # in-process exporter and `gpumem demo` use, read while its context is steady.
    serve = subprocess.Popen([gpumem, "serve", "--listen", "127.0.0.1:9413", "--interval", "500ms",
                              "--allow-cuda-context", "--nvml-library", "/nonexistent/libnvidia-ml.so"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4)
    served = scrape("http://127.0.0.1:9413/metrics")
    free_now, used_now = smi_free_used()
    check("device free, cuMemGetInfo path (`serve --allow-cuda-context`)",
          (first(served, "gpumem_device_memory_free_bytes", 'gpu="0"') or 0) / MIB, free_now, 2)
    check("device used, cuMemGetInfo path (`serve --allow-cuda-context`)",
          (first(served, "gpumem_device_memory_used_bytes", 'gpu="0"') or 0) / MIB, used_now, 2)
finally:
    for process in (serve, holder):
        if process:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
json.dump(result, open(os.path.join(out, "truthfulness.json"), "w"), indent=1)
