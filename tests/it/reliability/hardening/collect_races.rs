//! Case 1: a writer swaps a collected file for a FIFO or a symlink between the collector's
//! directory listing and its open. Neither may block the collector, nor show a file from
//! outside the directory; and a serving sidecar keeps answering and stops on SIGTERM.

use crate::reliability::Scratch;
use crate::web::get;
use gpumem_observe::collect::read_file;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// `read_file` on a FIFO returns at once (the old code blocked in `open` for good).
#[test]
fn reading_a_fifo_never_blocks() {
    let dir = Scratch::new("fifo");
    let fifo = dir.path().join("gpumem-1.json");
    mkfifo(&fifo);
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(read_file(&fifo, 1 << 20).map_err(|r| r.to_string()));
    });
    let outcome = receiver
        .recv_timeout(Duration::from_secs(5))
        .expect("read_file on a FIFO must not block");
    let error = outcome.expect_err("a FIFO is not a published file");
    assert!(error.contains("FIFO"), "{error}");
}

/// `read_file` on a symlink to a valid file elsewhere refuses it (the old code followed it).
#[test]
fn reading_a_symlink_never_follows_it() {
    let dir = Scratch::new("symlink");
    let outside = Scratch::new("symlink-outside");
    let secret = outside.file(
        "secret.json",
        super::published(std::process::id(), "outside", gpumem_wire::unix_now(), 1, 1).as_bytes(),
    );
    let link = dir.path().join("gpumem-2.json");
    std::os::unix::fs::symlink(&secret, &link).expect("symlink");
    let error = read_file(&link, 1 << 20).expect_err("a link is not followed");
    assert!(error.to_string().contains("symbolic link"), "{error}");
}

/// The race itself, end to end: while a writer keeps swapping a regular file, a FIFO and a
/// symlink to a file outside in and out of the collect directory, `gpumem serve` keeps its
/// health, never exports the outside file, and still stops promptly on SIGTERM.
#[test]
fn a_serving_sidecar_survives_files_swapped_under_it() {
    let dir = Scratch::new("swap");
    let outside = Scratch::new("swap-outside");
    let now = gpumem_wire::unix_now();
    let me = std::process::id();
    let secret = outside.file(
        "secret.json",
        super::published(me, "outside-secret", now + 5.0, 1, 1).as_bytes(),
    );
    let regular = dir.path().join(".regular");
    let fifo = dir.path().join(".fifo");
    let link = dir.path().join(".link");
    let target = dir.path().join("gpumem-7.json");
    let mut sidecar =
        super::collecting_sidecar(dir.path(), "100ms", std::process::Stdio::inherit());
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let (regular, fifo, link, target) = (regular.clone(), fifo.clone(), link.clone(), target);
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let content = super::published(me, "inside", gpumem_wire::unix_now(), 1, 1);
                std::fs::write(&regular, content).expect("write");
                let _ = std::fs::remove_file(&fifo);
                mkfifo(&fifo);
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&secret, &link).expect("symlink");
                let swap_in = match round % 3 {
                    0 => &regular,
                    1 => &fifo,
                    _ => &link,
                };
                let _ = std::fs::rename(swap_in, &target);
                round += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut scrapes = 0;
    while Instant::now() < deadline {
        let health = get(sidecar.addr, "/healthz");
        assert_eq!(health.status, 200, "/healthz: {}", health.body);
        let snapshot = get(sidecar.addr, "/api/v1/snapshot").body;
        assert!(
            !snapshot.contains("outside-secret"),
            "a file outside the collect directory was exported"
        );
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(150));
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("the swapper thread");
    assert!(scrapes > 10);
    let started = Instant::now();
    let status = sidecar.terminate(Duration::from_secs(20));
    assert!(status.success(), "serve exited with {status:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
}
