//! Case 5: every input is bounded. A config file that never ends (`/dev/zero`) or never
//! starts (a FIFO nobody writes, as `--config`, `GPUMEM_CONFIG` or a trace) fails at once with
//! one line; strings in collected files (device names, the writer, wrong-typed values
//! quoted in errors) are cut before they are kept, logged or served.

use super::published;
use crate::reliability::{gpumem, Scratch};
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Runs `gpumem args` (with `env` set) and requires it to fail with exit 2 and one line naming
/// `needle` within 10 s, and to print nothing on stdout.
fn fails_fast(args: &[&str], env: Option<(&str, &str)>, needle: &str) {
    let started = Instant::now();
    let mut command = gpumem();
    command.args(args);
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpumem runs");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpumem {args:?} {env:?} still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let _ = child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout);
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr);
    assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
    assert!(stdout.is_empty(), "{args:?} printed {stdout:?}");
}

/// A FIFO nobody writes to, given where a file is read whole, used to hang the command in
/// `open` for good: refused at once, by every way it can be named.
#[test]
fn a_fifo_for_a_config_or_a_trace_is_refused_at_once() {
    let dir = Scratch::new("fifo-input");
    let fifo = dir.path().join("input.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let fifo = fifo.to_str().expect("a UTF-8 path");
    fails_fast(
        &["devices", "--backend", "sim", "--config", fifo],
        None,
        "a FIFO",
    );
    fails_fast(
        &["devices", "--backend", "sim"],
        Some(("GPUMEM_CONFIG", fifo)),
        "a FIFO",
    );
    fails_fast(&["replay", "--backend", "sim", fifo], None, "a FIFO");
}

/// `--config /dev/zero` used to grow by 300 MB/s until killed; a device is now refused before
/// a byte is read, and a regular file is still read at most 1 MiB.
#[test]
fn an_endless_config_file_fails_fast_with_one_line() {
    for command in [&["devices"][..], &["demo", "--duration", "1s"]] {
        let mut args = command.to_vec();
        args.extend(["--backend", "sim", "--config", "/dev/zero"]);
        fails_fast(&args, None, "a device, not a regular file");
    }
    let dir = Scratch::new("huge-config");
    let huge = dir.file("huge.toml", &vec![b'#'; 2 << 20]);
    let huge = huge.to_str().expect("a UTF-8 path");
    for command in [&["devices"][..], &["demo", "--duration", "1s"]] {
        let mut args = command.to_vec();
        args.extend(["--backend", "sim", "--config", huge]);
        fails_fast(&args, None, "larger than 1");
    }
}

/// A file with a 3 MB device name and writer, and one with a 3 MB string where a number
/// belongs: what is kept, and what a rejection says, stays short.
#[test]
fn strings_in_collected_files_are_cut() {
    let dir = Scratch::new("long-strings");
    let huge = "N".repeat(3 << 20);
    let mut file: serde_json::Value = serde_json::from_str(&published(
        std::process::id(),
        "engine",
        gpumem_wire::unix_now(),
        1,
        1,
    ))
    .expect("json");
    file["writer"] = huge.clone().into();
    file["devices"][0]["name"] = huge.clone().into();
    let path = dir.file("long.json", &serde_json::to_vec(&file).expect("encode"));
    let read =
        gpumem_observe::collect::read_file(&path, 16 << 20).expect("long text is cut, not refused");
    assert!(read.writer.as_deref().is_some_and(|w| w.len() <= 128));
    assert!(read.devices[0]
        .name
        .as_deref()
        .is_some_and(|n| n.len() <= 128));

    file["pid"] = huge.into();
    let path = dir.file("typed.json", &serde_json::to_vec(&file).expect("encode"));
    let rejection =
        gpumem_observe::collect::read_file(&path, 16 << 20).expect_err("pid is a number");
    let message = rejection.to_string();
    assert!(
        message.len() < 1000,
        "the rejection is {} bytes",
        message.len()
    );
}

/// The same through `gpumem serve` at its default log level: no log line and no snapshot
/// grows with the file (a 3 MB line and a 6 MB snapshot before).
#[test]
fn a_serving_sidecar_logs_and_serves_long_strings_cut() {
    let dir = Scratch::new("long-serve");
    let huge = "\u{202E}W".repeat(1 << 20);
    let now = gpumem_wire::unix_now();
    let mut good: serde_json::Value =
        serde_json::from_str(&published(std::process::id(), "engine", now, 1, 1)).expect("json");
    good["devices"][0]["name"] = huge.clone().into();
    good["writer"] = huge.clone().into();
    dir.file("good.json", &serde_json::to_vec(&good).expect("encode"));
    good["pid"] = huge.clone().into();
    dir.file("typed.json", &serde_json::to_vec(&good).expect("encode"));
    good["pid"] = 7.into();
    good["format"] = huge.into();
    dir.file("format.json", &serde_json::to_vec(&good).expect("encode"));
    let mut sidecar = super::collecting_sidecar(dir.path(), "200ms", Stdio::piped());
    let addr = sidecar.addr;
    std::thread::sleep(Duration::from_millis(800));
    let snapshot = crate::web::get(addr, "/api/v1/snapshot").body;
    sidecar.kill_hard();
    let mut stderr = String::new();
    let _ = sidecar
        .child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr);
    assert!(
        snapshot.len() < 64 << 10,
        "the snapshot is {} bytes",
        snapshot.len()
    );
    assert!(!snapshot.contains('\u{202E}'), "a bidi override was served");
    let longest = stderr.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 2000, "a log line of {longest} bytes");
    assert!(
        stderr.contains("typed.json"),
        "the bad file is logged: {stderr:.2000}"
    );
}
