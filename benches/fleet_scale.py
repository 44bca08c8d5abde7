#!/usr/bin/env python3
"""What one node costs Prometheus: series and bytes per scrape of `gpumem serve` collecting a
busy GPU node — GPUS devices x PROCS processes, each publishing TAGS tags (the sidecar keeps the
largest --top-tags and sums the rest under `other`) and three pools per device.

usage: python3 benches/fleet_scale.py path/to/gpumem [--gpus 8] [--procs 20] [--tags 64]
Prints one JSON object: series in all and by family, bytes per scrape plain and gzip. The
figures in docs/fleet-scale.md came from this script; NVML's device and per-process series are
counted from their definitions where no GPU is present (the script says which)."""
import argparse
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def published(pid, gpus, procs_per_gpu, tags, now):
    """One process's file: it uses one GPU (processes are spread evenly), 64 tags, 3 pools."""
    gpu = pid % gpus
    tag_list = [
        {"tag": f"tag_{i:02d}", "live_bytes": (i + 1) << 20, "live_allocations": i + 1}
        for i in range(tags)
    ]
    return {
        "format": "gpumem.publish",
        "version": 1,
        "pid": pid,
        "process": f"engine-{pid}",
        "timestamp_seconds": now,
        "interval_seconds": 1.0,
        "writer": "fleet_scale.py",
        "devices": [{
            "gpu": gpu,
            "uuid": f"GPU-00000000-0000-0000-0000-{gpu:012d}",
            "reserved_bytes": 8 << 30,
            "in_use_bytes": 6 << 30,
            "ooms_total": 0,
            "pools": [
                {"pool": name, "reserved_bytes": 2 << 30}
                for name in ("small", "large", "graph")
            ],
            "tags": tag_list,
        }],
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gpumem", help="the gpumem binary")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", type=int, default=20, help="processes per GPU")
    parser.add_argument("--tags", type=int, default=64, help="tags each process publishes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        now = time.time()
        for pid in range(1000, 1000 + args.gpus * args.procs):
            with open(os.path.join(directory, f"gpumem-{pid}.json"), "w") as f:
                json.dump(published(pid, args.gpus, args.procs, args.tags, now), f)
        port = free_port()
        server = subprocess.Popen(
            [args.gpumem, "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1s",
             "--collect-dir", directory, "--collect-max-series", "1000000",
             "--exited-retention", "0s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env={**os.environ, "GPUMEM_LOG": "warn"})
        try:
            body = b""
            for _ in range(100):
                time.sleep(0.2)
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                except OSError:
                    continue
                if b"gpumem_collect_processes" in body and re.search(
                        rb"^gpumem_collect_processes(\{[^}]*\})? %d" % (args.gpus * args.procs), body, re.M):
                    break
        finally:
            server.terminate()
            server.wait(timeout=10)
    series = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    families = {}
    for line in series:
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
        families[name] = families.get(name, 0) + 1
    print(json.dumps({
        "gpus": args.gpus,
        "processes": args.gpus * args.procs,
        "tags_published_per_process": args.tags,
        "series": len(series),
        "bytes_plain": len(body),
        "bytes_gzip": len(gzip.compress(body)),
        "families": dict(sorted(families.items(), key=lambda kv: -kv[1])),
    }, indent=1))


if __name__ == "__main__":
    sys.exit(main())
