"""Many streams under gpumem as PyTorch's allocator, on a real GPU: more streams than get pools
of their own (16 per device), so most share pools, and memory freed on one stream while its
work is still queued must not reach another stream before that work has run.

Each round, every stream fills a fresh tensor with its own value, queues a long sleep kernel
and then a sum of that tensor, and drops the tensor at once (its free reaches the allocator
while the GPU has not yet run the sum). Every other stream then allocates the same size and
fills it with a different value. If the allocator handed the first stream's memory to another
stream too early, the first stream's sum reads the wrong value. Also checks that empty_cache()
gives the memory back.

    python3 benches/gpu/torch_many_streams.py [--streams 48] [--rounds 20]

Exit 0 only if every sum is right.
"""
from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--elements", type=int, default=1 << 18, help="per tensor (float32)")
    parser.add_argument("--allocator", choices=["gpumem", "default"], default="gpumem")
    args = parser.parse_args()
    if args.allocator == "gpumem":
        import gpumem.torch

        gpumem.torch.use()
    import torch

    streams = [torch.cuda.Stream() for _ in range(args.streams)]
    sums = []
    for round_ in range(args.rounds):
        for index, stream in enumerate(streams):
            value = float(round_ * 1000 + index + 1)
            with torch.cuda.stream(stream):
                x = torch.full((args.elements,), value, device="cuda")
                torch.cuda._sleep(1_000_000)  # keeps the stream busy past the free below
                sums.append((value * args.elements, x.sum()))
                del x  # freed on `stream` while its sum is still queued
            # Another stream takes memory of the same size at once and overwrites it.
            other = streams[(index + 1) % len(streams)]
            with torch.cuda.stream(other):
                y = torch.full((args.elements,), -1.0, device="cuda")
                del y
    torch.cuda.synchronize()
    wrong = [(want, float(got)) for want, got in sums if float(got) != want]
    print(
        f"{args.allocator}: {args.streams} streams x {args.rounds} rounds, "
        f"{len(sums)} sums, {len(wrong)} wrong"
    )
    if args.allocator == "gpumem":
        import gpumem.torch as g

        before = g.memory_reserved()
        g.empty_cache()
        print(f"reserved {before / 2**20:.0f} MiB, after empty_cache {g.memory_reserved() / 2**20:.0f} MiB")
    if wrong:
        print(f"FAILED: first wrong sums {wrong[:3]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
