//! The CUDA backend where no usable driver exists — no library, a stub library, a driver with no
//! devices — exercised for real with stub libraries built at test time; and, when
//! `GPUMEM_REQUIRE_GPU=1`, on a real GPU (properties, alloc/free, pages and free memory).
#![cfg(target_os = "linux")]

use gpumem::backend::cuda::{CudaBackend, DRIVER_SYMBOLS};
use gpumem::backend::{DeviceBackend, DirectMemory, StreamId, StreamOrder};
use gpumem::error::BackendError;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

/// The GPU tests compare device free memory before and after; run them one at a time.
fn gpu_lock() -> MutexGuard<'static, ()> {
    static GPU: Mutex<()> = Mutex::new(());
    GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn gpu_required() -> bool {
    std::env::var("GPUMEM_REQUIRE_GPU").is_ok_and(|value| value == "1")
}

#[test]
fn open_without_a_usable_driver_names_the_library() {
    match CudaBackend::open() {
        Ok(backend) => {
            assert!(backend.device_count() > 0);
            eprintln!(
                "skipped: a CUDA driver is present ({})",
                backend.library_name()
            );
        }
        Err(BackendError::DriverUnavailable { reason }) => {
            assert!(
                !gpu_required(),
                "GPUMEM_REQUIRE_GPU=1 but the driver is unavailable: {reason}"
            );
            assert!(reason.contains("libcuda"), "{reason}");
            if reason.contains("could not be loaded") {
                assert!(reason.contains("libcuda.so.1"), "{reason}");
            }
        }
        Err(other) => panic!("expected DriverUnavailable, got {other:?}"),
    }
}

#[test]
fn the_library_never_substitutes_the_simulated_device_unasked() {
    use gpumem::backend::{open_backend, open_backend_or_simulate, sim::SimConfig};
    use gpumem::{BackendChoice, BackendKind};
    match open_backend(BackendChoice::Auto, SimConfig::default()) {
        Ok(opened) => {
            assert_eq!(opened.backend.kind(), BackendKind::Cuda);
            assert!(!opened.simulated_fallback);
        }
        Err(error) => {
            assert!(
                !gpu_required(),
                "GPUMEM_REQUIRE_GPU=1 but auto failed: {error}"
            );
            let opened = open_backend_or_simulate(BackendChoice::Auto, SimConfig::default())
                .expect("the opt-in fallback opens the simulated device");
            assert_eq!(opened.backend.kind(), BackendKind::Sim);
            assert!(opened.simulated_fallback);
            assert!(opened.reason.contains("fell back"), "{}", opened.reason);
            // Asking for CUDA by name is refused by both openers.
            assert!(open_backend_or_simulate(BackendChoice::Cuda, SimConfig::default()).is_err());
        }
    }
}

#[test]
fn stub_library_without_the_driver_api_is_a_clear_error() {
    let Some(dir) = build_stub(
        "no-symbols",
        "int cuInit(unsigned int flags) { return 0; }\n",
    ) else {
        return;
    };
    let first_missing = DRIVER_SYMBOLS
        .iter()
        .find(|symbol| **symbol != "cuInit")
        .expect("the backend calls more than cuInit");
    let stderr = run_devices_with(&dir);
    assert!(stderr.contains("CUDA driver unavailable"), "{stderr}");
    assert!(stderr.contains("missing"), "{stderr}");
    assert!(stderr.contains(first_missing), "{stderr}");
    assert!(stderr.contains("stub"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn driver_with_no_devices_is_a_clear_error() {
    let mut source = String::from(
        "int cuInit(unsigned int flags) { return 0; }\n\
         int cuDriverGetVersion(int *version) { *version = 12080; return 0; }\n\
         int cuDeviceGetCount(int *count) { *count = 0; return 0; }\n\
         int cuGetErrorString(int error, const char **text) { *text = \"stub\"; return 0; }\n",
    );
    for symbol in DRIVER_SYMBOLS {
        if !source.contains(&format!(" {symbol}(")) {
            // 999 is CUDA_ERROR_UNKNOWN: anything the backend calls beyond the count fails.
            source.push_str(&format!("int {symbol}(void) {{ return 999; }}\n"));
        }
    }
    let Some(dir) = build_stub("no-devices", &source) else {
        return;
    };
    let stderr = run_devices_with(&dir);
    assert!(stderr.contains("CUDA driver unavailable"), "{stderr}");
    assert!(stderr.contains("no devices"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn real_gpu_properties_memory_and_pages() {
    let _serial = gpu_lock();
    let backend = match CudaBackend::open() {
        Ok(backend) => backend,
        Err(err) if !gpu_required() => {
            eprintln!(
                "skipped: no usable CUDA driver ({err}); set GPUMEM_REQUIRE_GPU=1 to require one"
            );
            return;
        }
        Err(err) => panic!("GPUMEM_REQUIRE_GPU=1 but the CUDA backend did not open: {err}"),
    };
    let count = backend.device_count();
    assert!(count > 0);
    assert!(matches!(
        backend.properties(count),
        Err(BackendError::InvalidDevice { requested, count: c }) if requested == count && c == count
    ));
    assert!(matches!(
        backend.mem_info(count),
        Err(BackendError::InvalidDevice { .. })
    ));

    let props = backend.properties(0).expect("properties of device 0");
    eprintln!("{props:#?}");
    assert!(!props.simulated);
    assert!(!props.name.is_empty());
    assert!(props.uuid.starts_with("GPU-"), "{}", props.uuid);
    assert_eq!(props.uuid.len(), 40, "{}", props.uuid);
    assert_eq!(props.uuid[4..], props.uuid[4..].to_lowercase());
    assert!(props.total_memory_bytes > 0);
    assert!(props.compute_capability.0 >= 3);
    assert!(props.multiprocessor_count > 0);
    let page = backend.granularity(0).expect("granularity");
    assert!(page.is_power_of_two(), "{page}");
    assert_eq!(page, props.allocation_granularity_bytes);

    let info = backend.mem_info(0).expect("mem_info");
    assert_eq!(info.total, props.total_memory_bytes);
    assert!(info.free > 0 && info.free <= info.total);

    // Several threads racing to retain the primary context all get a working one.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| backend.mem_info(0).expect("mem_info from another thread"));
        }
    });

    let ptr = backend.alloc(0, 1 << 20).expect("alloc 1 MiB");
    assert_ne!(ptr, 0);
    backend.free(0, ptr).expect("free");
    assert_eq!(
        backend.free(0, ptr),
        Err(BackendError::InvalidAddress { device: 0, ptr })
    );
    assert!(matches!(
        backend.alloc(0, props.total_memory_bytes * 2),
        Err(BackendError::OutOfMemory { device: 0, .. })
    ));
    backend
        .synchronize_stream(0, StreamId::DEFAULT)
        .expect("synchronize the default stream");

    if !props.virtual_memory_supported {
        eprintln!("skipped the page checks: no virtual memory management on this device");
        return;
    }
    let base = backend
        .reserve_address_range(0, 4 * page)
        .expect("reserve 4 pages");
    assert!(matches!(
        backend.map(0, base + 1, page),
        Err(BackendError::InvalidArgument { .. })
    ));
    assert!(matches!(
        backend.unmap(0, base, page),
        Err(BackendError::InvalidAddress { .. })
    ));
    let before = backend.mem_info(0).expect("mem_info").free;
    backend.map(0, base, 2 * page).expect("map 2 pages");
    let mapped = backend.mem_info(0).expect("mem_info").free;
    assert_eq!(
        before - mapped,
        2 * page,
        "free memory drops by the mapped bytes"
    );
    assert!(matches!(
        backend.map(0, base + page, page),
        Err(BackendError::InvalidArgument { .. })
    ));
    assert!(matches!(
        backend.release_address_range(0, base, 4 * page),
        Err(BackendError::InvalidArgument { .. })
    ));
    backend.unmap(0, base, 2 * page).expect("unmap 2 pages");
    assert_eq!(backend.mem_info(0).expect("mem_info").free, before);
    backend
        .release_address_range(0, base, 4 * page)
        .expect("release the range");
}

/// Compiles `source` into `DIR/libcuda.so.1` (and `libcuda.so`, the first name cudarc tries, so
/// the stub wins over a real driver too). `None` when there is no C compiler and CI is not set.
fn build_stub(name: &str, source: &str) -> Option<PathBuf> {
    if Command::new("cc").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "CI=true but there is no `cc` to build the stub libcuda with"
        );
        eprintln!("skipped: no `cc` to build a stub libcuda with");
        return None;
    }
    let dir = std::env::temp_dir().join(format!(
        "gpumem-stub-{name}-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).expect("create the stub directory");
    let c_file = dir.join("stub.c");
    std::fs::write(&c_file, source).expect("write the stub source");
    let library = dir.join("libcuda.so.1");
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&c_file)
        .output()
        .expect("run cc");
    assert!(
        output.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).expect("symlink libcuda.so");
    Some(dir)
}

/// Runs `gpumem devices --backend cuda` with the stub first on the loader path, checks it failed
/// cleanly with one `gpumem: ...` line, and returns that line.
fn run_devices_with(dir: &Path) -> String {
    let output: Output = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["devices", "--backend", "cuda"])
        .env("LD_LIBRARY_PATH", dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("run gpumem");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let code = output.status.code();
    assert!(
        code.is_some_and(|code| code != 0),
        "expected a non-zero exit, got {code:?}; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {stderr}");
    assert!(lines[0].starts_with("gpumem: "), "{stderr}");
    lines[0].to_string()
}

#[test]
fn real_gpu_drop_gives_back_pages_still_mapped() {
    let _serial = gpu_lock();
    let open = || match CudaBackend::open() {
        Ok(backend) => Some(backend),
        Err(err) if !gpu_required() => {
            eprintln!("skipped: no usable CUDA driver ({err})");
            None
        }
        Err(err) => panic!("GPUMEM_REQUIRE_GPU=1 but the CUDA backend did not open: {err}"),
    };
    // `observer` holds its own reference to the primary context, so it outlives `leaky`'s drop.
    let Some(observer) = open() else { return };
    let Some(leaky) = open() else { return };
    let props = observer.properties(0).expect("properties of device 0");
    if !props.virtual_memory_supported {
        return;
    }
    let page = props.allocation_granularity_bytes;
    let before = observer.mem_info(0).expect("mem_info").free;
    let base = leaky.reserve_address_range(0, 2 * page).expect("reserve");
    leaky.map(0, base, 2 * page).expect("map 2 pages");
    assert_eq!(
        observer.mem_info(0).expect("mem_info").free,
        before - 2 * page
    );
    drop(leaky);
    assert_eq!(observer.mem_info(0).expect("mem_info").free, before);
}
