"""Builds the gpumem C library with cargo and ships it inside the Python package.

The Rust crate lives one directory up; `pip install ./python` (from the repository root) runs
`cargo build --release -p gpumem-capi` there (honouring CARGO_TARGET_DIR) and copies the library next to
the Python modules. The package also installs `gpumem-torch.pth`, which lets GPUMEM_TORCH=1 make
gpumem PyTorch's allocator without editing any code.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
LIBRARY = {"darwin": "libgpumem.dylib", "win32": "gpumem.dll"}.get(sys.platform, "libgpumem.so")


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        manifest = REPOSITORY / "Cargo.toml"
        if not manifest.is_file():
            sys.exit(f"gpumem: {manifest} not found; install from a checkout of the repository")
        if shutil.which("cargo") is None:
            sys.exit("gpumem: cargo is needed to build the library; install Rust from https://rustup.rs")
        target = Path(os.environ.get("CARGO_TARGET_DIR") or REPOSITORY / "target")
        if not target.is_absolute():
            target = REPOSITORY / target
        command = ["cargo", "build", "--release", "-p", "gpumem-capi", "--manifest-path", str(manifest)]
        print("gpumem: " + " ".join(command), flush=True)
        subprocess.run(command, check=True, env={**os.environ, "CARGO_TARGET_DIR": str(target)})
        package = Path(self.build_lib) / "gpumem"
        package.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target / "release" / LIBRARY, package / LIBRARY)
        # A .pth at the top of site-packages runs at interpreter start; it does nothing unless
        # GPUMEM_TORCH is set (see gpumem/_autouse.py).
        shutil.copy2(HERE / "gpumem-torch.pth", Path(self.build_lib) / "gpumem-torch.pth")


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it is tagged for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCargo}, distclass=BinaryDistribution)
