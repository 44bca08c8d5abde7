"""Forked data-loader workers of a process whose CUDA allocator is gpumem, on a real GPU.

PyTorch's DataLoader forks its workers by default on Linux. The parent keeps allocating and
freeing CUDA memory through gpumem on other threads while it forks, and every worker inherits
CUDA tensors it then drops (when its dataset copy goes, and at exit). No worker may hang: each
epoch has a timeout, and the script fails if one passes. Also checks that the parent's
results are the same with gpumem as without it.

    python3 benches/gpu/torch_fork_workers.py [--epochs 10] [--workers 4] [--allocator gpumem]

Prints one line per epoch and a summary; exit 0 only if every worker of every epoch finished.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--allocator", choices=["gpumem", "default"], default="gpumem")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per epoch")
    args = parser.parse_args()

    if args.allocator == "gpumem":
        import gpumem.torch

        gpumem.torch.use()
    import torch
    from torch.utils.data import DataLoader, Dataset

    class HoldsCudaTensors(Dataset):  # type: ignore[type-arg]
        """A dataset whose object carries CUDA tensors, as datasets with cached tensors do:
        every forked worker inherits them and frees its copy."""

        def __init__(self) -> None:
            self.on_gpu = [torch.ones(1 << 16, device="cuda") for _ in range(8)]

        def __len__(self) -> int:
            return 256

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.full((64,), float(index))

    stop = threading.Event()
    churned = [0]

    def churn() -> None:
        # Threads inside the allocator while the main thread forks.
        while not stop.is_set():
            blocks = [torch.empty(1 << (10 + i % 12), device="cuda") for i in range(32)]
            del blocks
            churned[0] += 32

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    dataset = HoldsCudaTensors()
    total = torch.zeros(64, device="cuda")
    started = time.monotonic()
    failed = None
    for epoch in range(args.epochs):
        loader = DataLoader(
            dataset,
            batch_size=32,
            num_workers=args.workers,
            multiprocessing_context="fork",
            timeout=args.timeout,
        )
        t0 = time.monotonic()
        try:
            for batch in loader:
                total += batch.cuda().sum(dim=0)
        except Exception as error:  # a worker that hangs raises after `timeout`
            failed = f"epoch {epoch}: {type(error).__name__}: {error}"
            break
        print(f"epoch {epoch}: {args.workers} forked workers done in {time.monotonic() - t0:.2f} s")
    stop.set()
    for thread in threads:
        thread.join()
    torch.cuda.synchronize()
    checksum = float(total.sum().item())
    print(
        f"{args.allocator}: {args.epochs} epochs x {args.workers} workers, "
        f"{churned[0]} allocations churned meanwhile, checksum {checksum:.1f}, "
        f"{time.monotonic() - started:.1f} s"
    )
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
