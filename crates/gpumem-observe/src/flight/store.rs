//! The flight recorder's directory: each record written atomically under a name that sorts by
//! time, the directory kept within a number of files and a total size (oldest removed first),
//! and records other processes wrote there read back (a collector shows the engines' records).

use super::record::{FlightRecord, FORMAT, VERSION};
use gpumem::safe_fs::{write_atomically, WriteOptions};
use std::path::{Path, PathBuf};

/// Records larger than this are not read back (a real one is a few tens of KiB).
const MAX_RECORD_BYTES: u64 = 4 << 20;

/// `20250102T030405.678Z`: UTC, sorts as it reads, no characters a file system dislikes.
pub fn utc_stamp(unix_seconds: f64) -> String {
    let millis = (unix_seconds.max(0.0) * 1000.0) as u64;
    let (secs, ms) = (millis / 1000, millis % 1000);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}.{ms:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to a (year, month, day) of the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Whether `name` is a record file (ours or another gpumem's): `<stamp>-<trigger>-….json`.
pub fn is_record_name(name: &str) -> bool {
    name.ends_with(".json")
        && name.as_bytes().first().is_some_and(u8::is_ascii_digit)
        && (name.contains("-oom-") || name.contains("-critical_pressure-"))
}

/// Writes `record` into `dir` under its `file` name, then removes the oldest records while there
/// are more than `max_files` or they take more than `max_bytes`. Returns the path written.
pub fn write(
    dir: &Path,
    record: &FlightRecord,
    max_files: usize,
    max_bytes: u64,
) -> std::io::Result<PathBuf> {
    let name = record
        .file
        .as_deref()
        .ok_or_else(|| std::io::Error::other("the record has no file name"))?;
    std::fs::create_dir_all(dir)?;
    let bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    // Written once and kept: worth an fsync, so a crash right after leaves the record whole.
    let options = WriteOptions {
        inputs: Vec::new(),
        durable: true,
    };
    // Room first (oldest records go), so the bounds hold and a nearly full disk has the old
    // records' space for the new one.
    prune(
        dir,
        max_files.saturating_sub(1),
        max_bytes.saturating_sub(bytes.len() as u64),
    );
    write_atomically(&dir.join(name), &bytes, &options)?;
    Ok(dir.join(name))
}

/// The record files of `dir`, oldest first, with their sizes.
fn listing(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, u64)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let meta = entry.metadata().ok().filter(std::fs::Metadata::is_file)?;
            let name = entry.file_name().into_string().ok()?;
            is_record_name(&name).then_some((name, meta.len()))
        })
        .collect();
    files.sort();
    files
}

/// Removes the oldest records until at most `max_files` are left, holding at most `max_bytes`
/// together; a file that cannot be removed is skipped.
fn prune(dir: &Path, max_files: usize, max_bytes: u64) {
    let files = listing(dir);
    let mut count = files.len();
    let mut total: u64 = files.iter().map(|(_, size)| size).sum();
    for (name, size) in files {
        if count <= max_files && total <= max_bytes {
            break;
        }
        match std::fs::remove_file(dir.join(&name)) {
            Ok(()) => {
                count -= 1;
                total = total.saturating_sub(size);
            }
            Err(error) => tracing::debug!("flight recorder: could not remove {name}: {error}"),
        }
    }
}

/// The newest `limit` record files in `dir` not yet `known`, newest first, each with its record;
/// `None` for a file that is too large, unreadable or not a flight record (so the caller can
/// remember its name and not read it again).
pub fn read_new(
    dir: &Path,
    known: &dyn Fn(&str) -> bool,
    limit: usize,
) -> Vec<(String, Option<FlightRecord>)> {
    let mut found = Vec::new();
    for (name, size) in listing(dir).into_iter().rev() {
        if found.len() >= limit {
            break;
        }
        if known(&name) {
            continue;
        }
        // Other processes write this directory: the listing's size and type may be stale by
        // the time the file is opened, so open it as the collector does (no link followed, no
        // blocking on a FIFO, regular file checked after opening) and read no more than a
        // record may hold.
        let record = (size <= MAX_RECORD_BYTES)
            .then(|| read_record_bytes(&dir.join(&name)))
            .flatten()
            .and_then(|bytes| serde_json::from_slice::<FlightRecord>(&bytes).ok())
            .filter(|r| r.format == FORMAT && r.version <= VERSION);
        found.push((name, record));
    }
    found
}

/// The bytes of a record file, if it is a regular file of at most [`MAX_RECORD_BYTES`].
fn read_record_bytes(path: &Path) -> Option<Vec<u8>> {
    let file = gpumem::safe_fs::open_regular(path).ok()?;
    gpumem::safe_fs::read_capped(file, MAX_RECORD_BYTES)
        .ok()?
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_and_sort_by_time() {
        assert_eq!(utc_stamp(0.0), "19700101T000000.000Z");
        assert_eq!(utc_stamp(1_700_000_000.25), "20231114T221320.250Z");
        assert_eq!(utc_stamp(951_782_400.0), "20000229T000000.000Z");
        assert!(utc_stamp(1_700_000_000.0) < utc_stamp(1_700_000_001.0));
    }

    #[test]
    fn record_names_are_recognised() {
        assert!(is_record_name("20231114T221320.250Z-oom-gpu0.json"));
        assert!(is_record_name(
            "20231114T221320.250Z-critical_pressure-gpu1.json"
        ));
        assert!(!is_record_name("gpumem-42.json"));
        assert!(!is_record_name(".20231114T221320.250Z-oom-gpu0.json.tmp"));
    }

    #[test]
    fn the_directory_keeps_the_newest_within_its_bounds() {
        let dir = tempfile::tempdir().expect("temp dir");
        for i in 0..5 {
            let name = format!("2023111{i}T000000.000Z-oom-gpu0.json");
            std::fs::write(dir.path().join(name), vec![b'x'; 100]).expect("write");
        }
        std::fs::write(dir.path().join("notes.txt"), b"not ours").expect("write");
        prune(dir.path(), 3, u64::MAX);
        let left: Vec<String> = listing(dir.path()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(left.len(), 3);
        assert!(left[0].starts_with("20231112"), "{left:?}");
        prune(dir.path(), 10, 150);
        assert_eq!(
            listing(dir.path()).len(),
            1,
            "the size bound keeps the newest only"
        );
        assert!(
            dir.path().join("notes.txt").exists(),
            "other files are left alone"
        );
    }

    #[test]
    fn records_swapped_for_links_or_fifos_are_skipped_without_blocking() {
        let dir = tempfile::tempdir().expect("temp dir");
        let outside = tempfile::tempdir().expect("temp dir");
        let secret = outside.path().join("secret.json");
        std::fs::write(&secret, b"{}").expect("write");
        let link = dir.path().join("20231114T000000.000Z-oom-gpu0.json");
        std::os::unix::fs::symlink(&secret, &link).expect("symlink");
        assert_eq!(read_record_bytes(&link), None, "a link is not followed");
        let fifo = dir.path().join("20231114T000001.000Z-oom-gpu0.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|status| status.success()) {
            // Opening a FIFO with no writer would block forever without O_NONBLOCK.
            assert_eq!(read_record_bytes(&fifo), None, "a FIFO is not read");
        }
    }
}
