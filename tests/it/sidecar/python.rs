//! The Python package's writer of PyTorch's statistics (`gpumem.publish`, in
//! python/gpumem/publish.py), run against a stand-in `torch` module: what it writes must be a valid file the collector reads, with PyTorch's numbers in
//! the right fields, and its background publisher must remove the file when Python exits.

use super::TempDir;
use crate::web::tool_available;
use gpumem_observe::collect::read_file;
use std::process::{Command, Output};

/// Just enough of `torch` for the writer: device 0 in use, device 1 untouched.
const FAKE_TORCH_CUDA: &str = r#"
_STATS = {
    0: {
        "requested_bytes.all.current": 1000, "allocated_bytes.all.current": 1024,
        "reserved_bytes.all.current": 4096, "allocated_bytes.all.peak": 2048,
        "reserved_bytes.all.peak": 8192, "allocation.all.allocated": 10,
        "allocation.all.freed": 7, "allocation.all.current": 3,
        "segment.all.allocated": 2, "segment.all.freed": 1, "num_ooms": 1,
        "num_alloc_retries": 4, "reserved_bytes.small_pool.current": 1024,
        "allocated_bytes.small_pool.current": 512, "reserved_bytes.large_pool.current": 3072,
        "allocated_bytes.large_pool.current": 512,
    },
    1: {"reserved_bytes.all.peak": 0},
}

class _Properties:
    uuid = "8d2e4d1a-0000-1111-2222-333344445555"

def is_initialized():
    return True

def device_count():
    return len(_STATS)

def memory_stats(index):
    return dict(_STATS[index])

def get_device_properties(index):
    return _Properties()
"#;

/// Runs `script` as `engine.py` with the publish directory as its argument, next to the stand-in
/// `torch` with the package on the path, and checks it succeeds; `None` (skip) without python3.
fn run_engine(dir: &TempDir, publish: &TempDir, script: &str) -> Option<Output> {
    if !tool_available("python3") {
        return None;
    }
    let package = dir.join("torch");
    std::fs::create_dir_all(&package).expect("mkdir");
    std::fs::write(
        package.join("__init__.py"),
        "__version__ = \"2.4.0+fake\"\nfrom . import cuda\n",
    )
    .expect("write");
    std::fs::write(package.join("cuda.py"), FAKE_TORCH_CUDA).expect("write");
    std::fs::write(dir.join("engine.py"), script).expect("write");
    let output = Command::new("python3")
        .env(
            "PYTHONPATH",
            std::env::join_paths([
                dir.path().to_path_buf(),
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python"),
            ])
            .expect("paths"),
        )
        .current_dir(dir.path())
        .args(["engine.py", publish.str()])
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(output)
}

#[test]
fn the_python_package_publishes_pytorch_statistics_as_a_valid_file() {
    let dir = TempDir::new("python");
    let publish = TempDir::new("python-publish");
    let Some(output) = run_engine(
        &dir,
        &publish,
        "import sys, gpumem.publish as gpumem_publish\nprint(gpumem_publish.publish_once(sys.argv[1]))\n",
    ) else {
        return;
    };
    let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let file =
        read_file(std::path::Path::new(&path), u64::MAX).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(file.process, "engine.py");
    every_key_is_a_record_field(&path);
    assert!(
        path.ends_with(&format!("gpumem-{}.json", file.pid)),
        "{path}"
    );
    assert_eq!(file.writer.as_deref(), Some("torch 2.4.0+fake"));
    assert_eq!(file.devices.len(), 1, "only the device the process uses");
    let device = &file.devices[0];
    assert_eq!(
        device.uuid.as_deref(),
        Some("GPU-8d2e4d1a-0000-1111-2222-333344445555")
    );
    assert_eq!(
        (
            device.in_use_bytes,
            device.reserved_bytes,
            device.reserved_peak_bytes
        ),
        (Some(1024), Some(4096), Some(8192))
    );
    assert_eq!(
        (device.ooms_total, device.oom_retries_total),
        (Some(1), Some(4))
    );
    assert_eq!(
        device.leak_suspect_bytes, None,
        "PyTorch does not know leak ages"
    );
    let large = device
        .pools
        .iter()
        .find(|p| p.pool == "large")
        .expect("large pool");
    assert_eq!(large.cached_free_bytes, Some(2560));
    if cfg!(target_os = "linux") {
        assert_eq!(
            file.pid_namespace,
            gpumem_wire::process::current_pid_namespace()
        );
    }
    let names: Vec<_> = std::fs::read_dir(publish.path())
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o644,
            "the sidecar (another user) must be able to read it"
        );
    }
}

#[test]
fn the_python_background_publisher_removes_its_file_at_exit() {
    let dir = TempDir::new("python-start");
    let publish = TempDir::new("python-start-publish");
    let Some(output) = run_engine(
        &dir,
        &publish,
        "import os, sys, time, gpumem.publish as gpumem_publish\n\
         gpumem_publish.start(sys.argv[1], 0.1)\n\
         time.sleep(0.5)\n\
         print(os.path.exists(os.path.join(sys.argv[1], f'gpumem-{os.getpid()}.json')))\n",
    ) else {
        return;
    };
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "True",
        "published while running"
    );
    let left = std::fs::read_dir(publish.path()).expect("list").count();
    assert_eq!(left, 0, "the file is removed when Python exits");
}

/// Every key the Python publisher writes for a device and a pool is a field of the device
/// record, whose fields are `/metrics`' families (checked in `web::metrics`): a misspelt key
/// would otherwise be dropped without a word.
fn every_key_is_a_record_field(path: &str) {
    use gpumem_wire::{ProcessDevice, ProcessPool, ProcessTag, PublishedDeviceMemory};
    let text = std::fs::read_to_string(path).expect("the published file");
    let written: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let record = serde_json::to_value(ProcessDevice {
        device_memory: Some(PublishedDeviceMemory::default()),
        pools: vec![ProcessPool::default()],
        tags: vec![ProcessTag::default()],
        ..ProcessDevice::default()
    })
    .expect("serialises");
    let device = &written["devices"][0];
    for (what, written, known) in [
        ("device", device, &record),
        ("pool", &device["pools"][0], &record["pools"][0]),
    ] {
        for key in written.as_object().expect("an object").keys() {
            assert!(
                known.get(key).is_some(),
                "the publisher writes a {what} key {key:?} the record does not have"
            );
        }
    }
}
