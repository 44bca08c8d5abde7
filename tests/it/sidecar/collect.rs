//! The collector against real directories: fresh, stale and exited processes; every kind of bad
//! file (never fatal, counted, previous content kept); duplicates; the file limit; a directory
//! that disappears; and atomic writes read while they are being replaced.

use super::{now, published, TempDir};
use gpumem::safe_fs::write_atomically;
use gpumem_observe::collect::{check_dir, CollectDir, CollectSettings, Collected};
use std::time::Duration;

fn collector(dir: &TempDir) -> CollectDir {
    CollectDir::new(CollectSettings::new(dir.path(), Duration::from_secs(1)))
}

fn count(counts: &[gpumem_wire::ReasonCount], reason: &str) -> u64 {
    counts
        .iter()
        .find(|c| c.reason == reason)
        .map_or(0, |c| c.count)
}

fn pids(collected: &Collected) -> Vec<u32> {
    collected.processes.iter().map(|p| p.pid).collect()
}

#[test]
fn fresh_files_are_exported_and_stale_ones_dropped() {
    let dir = TempDir::new("stale");
    let me = std::process::id();
    let t = now();
    std::fs::write(dir.join("gpumem-1.json"), published(me, "engine", t)).expect("write");
    let mut collector = collector(&dir);

    let fresh = collector.scan_at(t + 0.5);
    assert_eq!(pids(&fresh), [me]);
    let process = &fresh.processes[0];
    assert_eq!(process.process, "engine");
    assert_eq!(process.devices[0].reserved_bytes, Some(64 << 20));
    assert_eq!(process.file, "gpumem-1.json");
    assert!(fresh.status.readable && fresh.problem.is_none());

    // Three intervals without a new snapshot: dropped, counted once however long it stays.
    let stale = collector.scan_at(t + 3.5);
    assert!(stale.processes.is_empty());
    assert_eq!(count(&stale.status.dropped_total, "stale"), 1);
    let still = collector.scan_at(t + 10.0);
    assert_eq!(count(&still.status.dropped_total, "stale"), 1);

    // A new snapshot brings it back.
    std::fs::write(dir.join("gpumem-1.json"), published(me, "engine", t + 10.0)).expect("write");
    assert_eq!(pids(&collector.scan_at(t + 10.5)), [me]);
}

#[test]
fn a_writer_with_a_longer_interval_gets_three_of_its_own() {
    let dir = TempDir::new("writer-interval");
    let t = now();
    let slow = published(std::process::id(), "slow", t)
        .replace("\"interval_seconds\":1.0", "\"interval_seconds\":10.0");
    std::fs::write(dir.join("slow.json"), slow).expect("write");
    let mut collector = collector(&dir);
    assert_eq!(collector.scan_at(t + 20.0).processes.len(), 1);
    assert!(collector.scan_at(t + 31.0).processes.is_empty());
}

#[cfg(target_os = "linux")]
#[test]
fn a_dead_pid_is_dropped_at_once_when_the_namespace_is_ours() {
    let dir = TempDir::new("dead");
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("true runs");
    let dead = child.id();
    child.wait().expect("reaped");
    let t = now();
    std::fs::write(dir.join("dead.json"), published(dead, "gone", t)).expect("write");
    // The same pid seen from another namespace cannot be checked: staleness decides.
    let foreign = published(dead, "elsewhere", t).replace(
        &format!(
            "\"pid_namespace\":\"{}\"",
            gpumem_wire::process::current_pid_namespace().expect("linux")
        ),
        "\"pid_namespace\":\"pid:[1]\"",
    );
    std::fs::write(dir.join("foreign.json"), foreign).expect("write");
    let mut collector = collector(&dir);
    let collected = collector.scan_at(t + 0.1);
    let names: Vec<&str> = collected
        .processes
        .iter()
        .map(|p| p.process.as_str())
        .collect();
    assert_eq!(names, ["elsewhere"]);
    assert_eq!(count(&collected.status.dropped_total, "exited"), 1);
}

#[test]
fn bad_files_are_skipped_counted_and_never_fatal() {
    let dir = TempDir::new("bad");
    let t = now();
    let good = published(std::process::id(), "engine", t);
    std::fs::write(dir.join("good.json"), &good).expect("write");
    std::fs::write(dir.join("empty.json"), "").expect("write");
    std::fs::write(dir.join("torn.json"), &good[..good.len() / 2]).expect("write");
    std::fs::write(dir.join("garbage.json"), b"\x00\xffnot json at all").expect("write");
    std::fs::write(
        dir.join("newer.json"),
        r#"{"format":"gpumem.publish","version":99,"pid":5,"whatever":"v99 looks different"}"#,
    )
    .expect("write");
    std::fs::write(
        dir.join("invalid.json"),
        good.replace("\"pid\":", "\"pid\":-"),
    )
    .expect("write");
    std::fs::write(dir.join("other-format.json"), r#"{"hello":"world"}"#).expect("write");
    // Just over the 4 MiB cap, and valid JSON otherwise: refused by size alone.
    let padding = " ".repeat((4 << 20) + 1);
    std::fs::write(dir.join("huge.json"), format!("{good}{padding}")).expect("write");
    // Not candidates at all: hidden, temporary, not *.json, a directory, a FIFO.
    std::fs::write(dir.join(".hidden.json"), &good).expect("write");
    std::fs::write(dir.join("gpumem-9.json.tmp"), &good).expect("write");
    std::fs::create_dir(dir.join("subdir.json")).expect("mkdir");
    let fifo = std::process::Command::new("mkfifo")
        .arg(dir.join("fifo.json"))
        .status()
        .is_ok_and(|s| s.success());

    let mut collector = collector(&dir);
    let collected = collector.scan_at(t + 0.1);
    assert_eq!(
        pids(&collected),
        [std::process::id()],
        "the good file still counts"
    );
    assert!(
        collected.problem.is_none(),
        "bad files are not a failed sample"
    );
    let rejected = &collected.status.rejected;
    for (reason, expected) in [
        ("empty", 1),
        ("truncated", 1),
        ("not_json", 1),
        ("newer_version", 1),
        ("invalid", 2),
        ("too_large", 1),
    ] {
        assert_eq!(count(rejected, reason), expected, "{reason}: {rejected:?}");
    }
    assert_eq!(
        collected.status.files, 8,
        "regular *.json files only (a FIFO was made: {fifo}): {:?}",
        collected.status
    );
    // Every scan counts again in the totals; the per-scan numbers stay.
    let again = collector.scan_at(t + 0.2);
    assert_eq!(count(&again.status.rejections_total, "empty"), 2);
    assert_eq!(count(&again.status.rejected, "empty"), 1);
    assert_eq!(count(&again.status.rejections_total, "duplicate_pid"), 0);
}

#[test]
fn a_torn_rewrite_keeps_the_previous_content_until_it_goes_stale() {
    let dir = TempDir::new("torn");
    let t = now();
    let file = dir.join("engine.json");
    std::fs::write(&file, published(std::process::id(), "engine", t)).expect("write");
    let mut collector = collector(&dir);
    assert_eq!(collector.scan_at(t + 0.1).processes.len(), 1);
    // A writer that does not rename, caught mid-write.
    std::fs::write(&file, r#"{"format":"gpumem.publish","version":1,"pid":"#).expect("write");
    let torn = collector.scan_at(t + 0.5);
    assert_eq!(torn.processes.len(), 1, "the last good snapshot stays");
    assert_eq!(count(&torn.status.rejected, "truncated"), 1);
    assert!(
        collector.scan_at(t + 3.5).processes.is_empty(),
        "until it is stale"
    );
}

#[test]
fn a_removed_file_drops_its_process_at_once() {
    let dir = TempDir::new("removed");
    let t = now();
    std::fs::write(dir.join("a.json"), published(std::process::id(), "a", t)).expect("write");
    let mut collector = collector(&dir);
    assert_eq!(collector.scan_at(t).processes.len(), 1);
    std::fs::remove_file(dir.join("a.json")).expect("remove");
    assert!(collector.scan_at(t + 0.1).processes.is_empty());
}

#[test]
fn two_files_for_one_process_keep_the_newer() {
    let dir = TempDir::new("duplicate");
    let t = now();
    let me = std::process::id();
    std::fs::write(dir.join("old.json"), published(me, "engine", t - 1.0)).expect("write");
    std::fs::write(dir.join("new.json"), published(me, "engine", t)).expect("write");
    std::fs::write(dir.join("other.json"), published(me, "other", t)).expect("write");
    let collected = collector(&dir).scan_at(t + 0.1);
    let kept: Vec<(&str, &str)> = collected
        .processes
        .iter()
        .map(|p| (p.process.as_str(), p.file.as_str()))
        .collect();
    assert_eq!(kept, [("engine", "new.json"), ("other", "other.json")]);
    assert_eq!(count(&collected.status.rejected, "duplicate_pid"), 1);
}

#[test]
fn at_most_max_files_are_read() {
    let dir = TempDir::new("many");
    let t = now();
    for i in 0..5 {
        let name = format!("p{i}");
        std::fs::write(
            dir.join(&format!("{name}.json")),
            published(std::process::id(), &name, t),
        )
        .expect("write");
    }
    let mut settings = CollectSettings::new(dir.path(), Duration::from_secs(1));
    settings.max_files = 3;
    let collected = CollectDir::new(settings).scan_at(t);
    assert_eq!(collected.processes.len(), 3);
    assert_eq!(count(&collected.status.rejected, "too_many_files"), 2);
    assert_eq!(collected.status.files, 5);
}

#[test]
fn a_directory_that_disappears_is_a_counted_problem_not_a_crash() {
    let dir = TempDir::new("vanishing");
    let t = now();
    std::fs::write(dir.join("a.json"), published(std::process::id(), "a", t)).expect("write");
    let mut collector = collector(&dir);
    assert_eq!(collector.scan_at(t).processes.len(), 1);
    std::fs::remove_dir_all(dir.path()).expect("remove the directory");
    let gone = collector.scan_at(t + 0.5);
    assert!(!gone.status.readable);
    assert_eq!(gone.status.dir_errors_total, 1);
    let problem = gone.problem.expect("a problem to report");
    assert!(
        problem.contains("cannot read the collect directory"),
        "{problem}"
    );
    assert_eq!(
        gone.processes.len(),
        1,
        "what was collected stays until stale"
    );
    assert!(collector.scan_at(t + 3.5).processes.is_empty());
    std::fs::create_dir_all(dir.path()).expect("recreate");
    let back = collector.scan_at(t + 4.0);
    assert!(back.status.readable && back.problem.is_none());
    assert_eq!(back.status.dir_errors_total, 2);
}

#[test]
fn the_start_check_names_what_is_wrong() {
    let dir = TempDir::new("check");
    assert!(check_dir(dir.path()).is_ok());
    let missing = check_dir(&dir.join("nope")).expect_err("missing");
    assert!(missing.contains("does not exist"), "{missing}");
    std::fs::write(dir.join("file"), "").expect("write");
    let file = check_dir(&dir.join("file")).expect_err("a file");
    assert!(file.contains("is not a directory"), "{file}");
}

#[test]
fn atomic_writes_are_never_seen_half_written() {
    let dir = TempDir::new("atomic");
    let path = dir.path().to_path_buf();
    let me = std::process::id();
    let writer = std::thread::spawn(move || {
        for i in 0..400u32 {
            // Sizes vary, so a torn read would show up as a truncated or invalid file.
            let mut text = published(me, "writer", now());
            if i % 2 == 0 {
                text.push_str(&" ".repeat(20_000));
            }
            write_atomically(
                &path.join("gpumem-writer.json"),
                text.as_bytes(),
                &Default::default(),
            )
            .expect("write");
        }
    });
    let mut collector = collector(&dir);
    let mut scans = 0;
    while !writer.is_finished() {
        let collected = collector.scan();
        let rejected: u64 = collected.status.rejected.iter().map(|r| r.count).sum();
        assert_eq!(rejected, 0, "{:?}", collected.status.rejected);
        scans += 1;
    }
    writer.join().expect("the writer finishes");
    assert!(scans > 0);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers, ["gpumem-writer.json"], "no temporary files left");
}
