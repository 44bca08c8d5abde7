"""Builds and loads gpumem's PyTorch layer: C++ sources (`torch_layer/`) that implement PyTorch's
CUDA allocator interface (`c10::cuda::CUDACachingAllocator::CUDAAllocator`, the one PyTorch's
own allocator implements) over the gpumem library, so that `torch.cuda.memory_stats`,
`OutOfMemoryError`, `empty_cache`, memory snapshots, CUDA-graph pools and `MemPool` all work.

C++ against PyTorch's headers has no stable ABI across PyTorch versions, so the layer is compiled
on first use for the PyTorch that is installed (about 20 seconds with g++; PyTorch's wheel ships
the headers, the CUDA runtime's headers come from the CUDA toolkit or NVIDIA's pip packages) and
kept in a cache directory keyed by PyTorch's version and the sources' hash:
`$GPUMEM_TORCH_LAYER_DIR`, else `$XDG_CACHE_HOME/gpumem`, else `~/.cache/gpumem`.
`python -m gpumem.torch build` builds it ahead (for an image). Where it cannot be built,
`gpumem.torch.use()` says why in one line and falls back to PyTorch's pluggable-allocator
interface (allocation and free only); `GPUMEM_TORCH_LAYER=require` makes that an error instead,
and `GPUMEM_TORCH_LAYER=off` skips the layer.
"""
from __future__ import annotations

import ctypes
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, List, Optional

from ._native import GpumemError

SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_layer")
SOURCES = ["gpumem_api.cpp", "private_pools.cpp", "history.cpp", "allocator.cpp",
           "stats_snapshot.cpp", "ipc.cpp", "install.cpp"]


class LayerUnavailable(GpumemError):
    """The PyTorch layer cannot be built or loaded here (the message says why)."""


def mode() -> str:
    """`auto` (the default: use the layer where it builds), `require` or `off`."""
    value = os.environ.get("GPUMEM_TORCH_LAYER", "auto").strip().lower()
    if value in ("", "auto", "1", "on", "true"):
        return "auto"
    if value in ("0", "off", "false", "no"):
        return "off"
    if value == "require":
        return "require"
    raise GpumemError(
        f"GPUMEM_TORCH_LAYER={value!r} is not one of auto, require, off")


def cache_dir() -> str:
    explicit = os.environ.get("GPUMEM_TORCH_LAYER_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpumem")


def _sources_hash() -> str:
    digest = hashlib.sha256()
    for name in sorted(os.listdir(SOURCE_DIR)):
        if name.endswith((".cpp", ".h")):
            with open(os.path.join(SOURCE_DIR, name), "rb") as source:
                digest.update(name.encode() + b"\0" + source.read())
    return digest.hexdigest()[:16]


def _loaded_cudart() -> Optional[str]:
    """The CUDA runtime PyTorch loaded (linking against that very file keeps one copy)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libcudart.so"):
                    return path
    except OSError:
        pass
    return None


def _cuda_include_dirs(torch: Any) -> List[str]:
    """Where cuda_runtime.h and the headers it includes are: the toolkit PyTorch finds, else
    NVIDIA's pip packages next to PyTorch, else the usual toolkit place."""
    candidates: List[str] = []
    try:
        from torch.utils import cpp_extension

        if cpp_extension.CUDA_HOME:
            candidates.append(os.path.join(cpp_extension.CUDA_HOME, "include"))
    except Exception:  # noqa: BLE001 - only a hint
        pass
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")))
    candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "include")))
    candidates.append("/usr/local/cuda/include")
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, "cuda_runtime.h")) and os.path.isfile(
                os.path.join(directory, "crt", "host_config.h")):
            return [directory]
    raise LayerUnavailable(
        "no CUDA headers found (cuda_runtime.h with crt/host_config.h): install the CUDA "
        "toolkit, or `pip install nvidia-cuda-runtime nvidia-cuda-crt` for your CUDA version")


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise LayerUnavailable("no C++ compiler found (g++, c++ or clang++; CXX names another)")


def library_for(torch: Any) -> str:
    """The built layer for this PyTorch: from the cache, or compiled now."""
    torch_dir = os.path.dirname(os.path.abspath(getattr(torch, "__file__", "") or "."))
    header = os.path.join(torch_dir, "include", "c10", "cuda", "CUDACachingAllocator.h")
    if not os.path.isfile(header):
        raise LayerUnavailable(
            f"this PyTorch ({getattr(torch, '__version__', 'unknown version')}) ships no C++ "
            "headers for its CUDA allocator (include/c10/cuda/CUDACachingAllocator.h): a CPU-only "
            "or stripped build?")
    version = str(torch.__version__).replace("+", "_").replace(os.sep, "_")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    directory = cache_dir()
    target = os.path.join(directory, f"torch_layer-{version}-abi{abi}-{_sources_hash()}.so")
    if os.path.isfile(target):
        return target
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise LayerUnavailable(
            f"cannot create the cache directory {directory} ({error.strerror}); "
            "set GPUMEM_TORCH_LAYER_DIR to a writable one") from error
    # One build at a time (the ranks of a job start together); the others wait and reuse it.
    with open(os.path.join(directory, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(target):
            _compile(torch, abi, target)
    return target


def _compile(torch: Any, abi: int, target: str) -> None:
    from torch.utils import cpp_extension

    torch_lib = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")
    cudart = _loaded_cudart()
    command = [_compiler(), "-std=c++17", "-O2", "-fPIC", "-shared",
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    for include in cpp_extension.include_paths() + _cuda_include_dirs(torch):
        command += ["-isystem", include]
    command += [os.path.join(SOURCE_DIR, name) for name in SOURCES]
    command += [f"-L{torch_lib}", "-lc10", "-lc10_cuda", "-ltorch_cuda",
                f"-Wl,-rpath,{torch_lib}"]
    if cudart:
        command += [f"-L{os.path.dirname(cudart)}", f"-l:{os.path.basename(cudart)}",
                    f"-Wl,-rpath,{os.path.dirname(cudart)}"]
    else:
        command += ["-lcudart"]
    print(f"gpumem: building the PyTorch layer for torch {torch.__version__} "
          f"(once; about 20 s) into {os.path.dirname(target)}", file=sys.stderr, flush=True)
    handle, partial = tempfile.mkstemp(suffix=".so.partial", dir=os.path.dirname(target))
    os.close(handle)
    try:
        result = subprocess.run(command + ["-o", partial], capture_output=True, text=True)
        if result.returncode != 0:
            first = next((line for line in result.stderr.splitlines() if "error" in line),
                         result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "")
            raise LayerUnavailable(
                f"compiling it against torch {torch.__version__} failed: {first.strip()}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def install(torch: Any, gpumem_library: str) -> None:
    """Makes gpumem PyTorch's allocator through the layer; raises LayerUnavailable or
    GpumemError (PyTorch's own refusal, e.g. after it has allocated) with the reason."""
    path = library_for(torch)
    try:
        layer = ctypes.CDLL(path)
    except OSError as error:
        raise LayerUnavailable(f"cannot load {path}: {error}") from error
    layer.gpumem_torch_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    layer.gpumem_torch_install.restype = ctypes.c_int
    message = ctypes.create_string_buffer(1024)
    if layer.gpumem_torch_install(os.fsencode(gpumem_library), message, len(message)) != 0:
        raise GpumemError(message.value.decode("utf-8", "replace"))
