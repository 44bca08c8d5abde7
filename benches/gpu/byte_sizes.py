"""Byte counts as the benchmark reports print them: 256 B, 64 KiB, 1 MiB, 1 GiB."""


def size_name(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"
