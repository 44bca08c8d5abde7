//! The publisher as an engine uses it: one file per process, rewritten every interval with what
//! the managers hold, readable by the collector, removed at shutdown; bad settings are errors at
//! `spawn`, never panics.

use super::TempDir;
use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::units::MIB;
use gpumem::{AllocOptions, ManagerConfig, MemoryManager, Tag};
use gpumem_observe::collect::read_file;
use gpumem_observe::publish::{PublishError, Publisher, FORMAT, VERSION};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn manager() -> MemoryManager {
    let sim = Arc::new(SimBackend::new(SimConfig::default()));
    MemoryManager::new(sim, ManagerConfig::default()).expect("manager")
}

#[test]
fn the_file_carries_the_managers_and_goes_away_at_shutdown() {
    let dir = TempDir::new("publisher");
    let target = dir.join("nested/publish");
    let manager = manager();
    let buffer = manager
        .alloc(0, 96 * MIB, &AllocOptions::tagged(Tag::new("kv_cache")))
        .expect("alloc");
    let publisher = Publisher::builder()
        .manager(manager.clone())
        .dir(&target)
        .interval(Duration::from_millis(100))
        .process_name("engine")
        .spawn()
        .expect("publishes");
    let path = publisher.path().to_path_buf();
    assert_eq!(
        path,
        target.join(format!("gpumem-{}.json", std::process::id())),
        "one file per process, in a directory created on demand"
    );
    let first = read_file(&path, u64::MAX).expect("a valid file at once");
    assert_eq!((first.format.as_str(), first.version), (FORMAT, VERSION));
    assert_eq!(first.pid, std::process::id());
    assert_eq!(first.process, "engine");
    assert!(first.pid_namespace.is_some() || !cfg!(target_os = "linux"));
    let device = &first.devices[0];
    assert!(device.requested_bytes >= Some(96 * MIB), "{device:?}");
    assert!(device
        .uuid
        .as_deref()
        .is_some_and(|u| u.starts_with("GPU-")));
    assert!(!device.pools.is_empty());

    // Rewritten every interval.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let later = read_file(&path, u64::MAX).expect("valid while being rewritten");
        if later.timestamp_seconds > first.timestamp_seconds {
            break;
        }
        assert!(Instant::now() < deadline, "the file was not rewritten");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(buffer);
    publisher.shutdown();
    assert!(!path.exists(), "shutdown removes the file");
    let left: Vec<_> = std::fs::read_dir(&target).expect("list").collect();
    assert!(left.is_empty(), "no temporary files left: {left:?}");
}

#[test]
fn dropping_the_handle_stops_publishing() {
    let dir = TempDir::new("dropped");
    let publisher = Publisher::builder()
        .manager(manager())
        .dir(dir.path())
        .interval(Duration::from_millis(100))
        .spawn()
        .expect("publishes");
    let path = publisher.path().to_path_buf();
    drop(publisher);
    let deadline = Instant::now() + Duration::from_secs(5);
    while path.exists() {
        assert!(Instant::now() < deadline, "the file outlived its publisher");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_settings_are_errors_at_spawn() {
    let dir = TempDir::new("bad-settings");
    std::fs::write(dir.join("a-file"), "").expect("write");
    let blocked = dir.join("a-file/publish");
    let error = Publisher::builder()
        .manager(manager())
        .dir(&blocked)
        .spawn()
        .map(drop)
        .expect_err("cannot create a directory under a file");
    assert!(matches!(error, PublishError::Dir { .. }), "{error:?}");
    assert!(error.to_string().contains("a-file/publish"), "{error}");

    let error = Publisher::builder()
        .manager(manager())
        .dir(dir.path())
        .interval(Duration::from_millis(10))
        .spawn()
        .map(drop)
        .expect_err("too fast");
    assert!(error.to_string().contains("too short"), "{error}");
    let error = Publisher::builder()
        .dir(dir.path())
        .spawn()
        .map(drop)
        .expect_err("nothing to publish");
    assert!(matches!(error, PublishError::NoManagers));
}
