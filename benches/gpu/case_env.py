# The command line and environment the PyTorch case scripts (torch_probes.py, torch_graphs.py)
# share: which gpumem library and Python package the cases use, and which cases run.
import argparse
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--library", help="libgpumem.so to use (default: $GPUMEM_LIBRARY or the package's)")
    parser.add_argument("--python-dir", default=os.path.join(HERE, "..", "..", "python"),
                        help="directory holding the gpumem package (default: the repository's python/)")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    return parser.parse_args()


def child_env(args):
    """The environment a case's process runs in: PyTorch's allocator settings cleared, the
    library and the package from the arguments."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if args.library:
        env["GPUMEM_LIBRARY"] = os.path.abspath(args.library)
    python_dir = os.path.abspath(args.python_dir)
    env["GPUMEM_PYTHON_DIR"] = python_dir  # holds gpumem-torch.pth too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [python_dir, env.get("PYTHONPATH")]))
    return env
