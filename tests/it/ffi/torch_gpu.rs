//! gpumem as PyTorch's allocator through its PyTorch layer, on a real GPU with a real PyTorch:
//! the drop-in checks of `benches/gpu/torch_dropin.py` that need no third-party library (every
//! `torch.cuda` statistics call, out-of-memory errors, `empty_cache`, the memory fraction,
//! snapshots and PyTorch's viewer, the PyTorch snapshot beside an OOM flight record, CUDA
//! graphs, `MemPool`, `torch.compile`'s CUDA-graph trees, CUDA IPC both ways).
//! Skipped without a GPU or PyTorch, unless `GPUMEM_REQUIRE_GPU=1`, which makes either a
//! failure. On the GPU host, run the test binary from the repository's root: the script and
//! the package are found there (or where the tests were built).

use crate::support::gpu_required;
use std::path::PathBuf;
use std::process::Command;

const CHECKS: &str = "stats,oom,oom_snapshot,empty_cache,memory_fraction,env_fraction,snapshot,\
                      graphs,mempool,compile_reduce_overhead,ipc,record_stream,profiler";

/// The repository: the current directory when it holds the script (the GPU host), else the
/// one the tests were built from.
fn repository() -> PathBuf {
    let here = std::env::current_dir().unwrap_or_default();
    if here.join("benches/gpu/torch_dropin.py").is_file() {
        here
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }
}

/// Whether PyTorch sees a CUDA device here; why not, when it does not.
fn pytorch_with_cuda() -> Result<(), String> {
    let probe = Command::new("python3")
        .args([
            "-c",
            "import torch; assert torch.cuda.is_available(), 'no CUDA device'",
        ])
        .output()
        .map_err(|e| format!("python3 does not run: {e}"))?;
    if probe.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&probe.stderr);
        Err(stderr.lines().last().unwrap_or("unknown").to_string())
    }
}

#[test]
fn the_pytorch_layer_answers_what_pytorch_asks_of_its_allocator() {
    if let Err(why) = pytorch_with_cuda() {
        assert!(
            !gpu_required(),
            "GPUMEM_REQUIRE_GPU=1 but PyTorch has no GPU: {why}"
        );
        eprintln!("skipped: PyTorch with a CUDA device is not here ({why})");
        return;
    }
    let repository = repository();
    let layer_dir = std::env::temp_dir().join(format!("gpumem-layer-{}", std::process::id()));
    let output = Command::new("python3")
        .arg(repository.join("benches/gpu/torch_dropin.py"))
        .args(["--modes", "gpumem", "--checks", CHECKS, "--timeout", "240"])
        .env("PYTHONPATH", repository.join("python"))
        .env("GPUMEM_LIBRARY", library())
        .env("GPUMEM_TORCH_LAYER", "require")
        .env("GPUMEM_TORCH_LAYER_DIR", &layer_dir)
        .env_remove("GPUMEM_BACKEND")
        .output()
        .expect("python3 runs");
    let _ = std::fs::remove_dir_all(&layer_dir);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let results: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("RESULT "))
        .map(|json| serde_json::from_str(json).expect("a result is JSON"))
        .collect();
    assert_eq!(
        results.len(),
        CHECKS.split(',').count(),
        "one result a check:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for result in &results {
        assert_eq!(result["status"], "works", "{result}");
    }
    println!("{} checks work under gpumem's PyTorch layer", results.len());
}

/// libgpumem.so beside this test binary: the GPU host has no cargo, so the library is copied
/// there with the binary (where the tests were built, `cargo build -p gpumem-cdylib` puts it
/// one directory up).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let beside = exe.parent().expect("the binary's directory");
    [beside.join("libgpumem.so"), beside.join("../libgpumem.so")]
        .into_iter()
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("no libgpumem.so beside {}", exe.display()))
}
