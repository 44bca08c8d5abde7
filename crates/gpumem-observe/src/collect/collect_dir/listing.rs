//! How [`CollectDir`] finds the files to read: a full listing of the collect directory when it
//! changed, else the files read last time looked at again, and each file's version ([`Stamp`])
//! so that an unchanged file is not read again.

use super::CollectDir;
use gpumem_wire::published::is_published_name;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

/// Which version of a file the listing saw: inode, size and modification time. A file whose
/// stamp has not changed is not read again; its last outcome stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stamp {
    inode: u64,
    size: u64,
    modified_ns: i128,
}

impl Stamp {
    pub(super) fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            inode: meta.ino(),
            size: meta.size(),
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// A file the scan may read: its name, modification time (Unix seconds) and version.
pub(super) type Candidate = (String, f64, Stamp);

/// The newest first, then by name.
fn newest_first(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0))
}

fn modified_seconds(meta: &std::fs::Metadata) -> f64 {
    meta.modified()
        .ok()
        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The directory listed at its last full listing: what `list` may reuse while the directory
/// itself has not changed.
#[derive(Clone)]
pub(super) struct Listing {
    dir_stamp: Stamp,
    listed_at: std::time::Instant,
    /// Published-looking names in the directory.
    pub(super) found: u64,
    /// Within the horizon, newest first, at most `max_files`.
    pub(super) candidates: Vec<Candidate>,
    /// Within the horizon, past `max_files`.
    pub(super) skipped: Vec<String>,
}

/// However still the directory is, it is listed in full at least this often.
const FULL_LISTING_EVERY: Duration = Duration::from_secs(30);

impl CollectDir {
    /// The files to read this scan, newest first: a full listing of the directory when it
    /// changed (its own mtime: a file created, renamed or removed) or every
    /// [`FULL_LISTING_EVERY`], else only the files read last time looked at again (one `stat`
    /// each, for writers that rewrite in place). A directory of 100k files left behind cost a
    /// fifth of a core listing and `stat`ing them all every second.
    pub(super) fn list(&mut self, dir: &Path, horizon: f64) -> std::io::Result<Listing> {
        let dir_meta = std::fs::metadata(dir)?;
        let dir_stamp = Stamp::of(&dir_meta);
        if let Some(previous) = self
            .listing
            .as_ref()
            .filter(|l| l.dir_stamp == dir_stamp && l.listed_at.elapsed() < FULL_LISTING_EVERY)
        {
            let mut candidates: Vec<Candidate> = previous
                .candidates
                .iter()
                .filter_map(|(name, ..)| {
                    let meta = dir.join(name).symlink_metadata().ok()?;
                    meta.is_file()
                        .then(|| (name.clone(), modified_seconds(&meta), Stamp::of(&meta)))
                })
                .collect();
            candidates.retain(|(_, modified, _)| *modified >= horizon);
            candidates.sort_by(newest_first);
            return Ok(Listing {
                candidates,
                ..previous.clone()
            });
        }
        // Regular files only (the file type does not follow links); `read_sized` checks again
        // on what it opens, since the entry can be swapped in between. Names first (no system
        // call), then one `stat` for the names that may be published.
        let mut candidates: Vec<Candidate> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                if !is_published_name(&name) {
                    return None;
                }
                let meta = entry.metadata().ok()?;
                Some((name, modified_seconds(&meta), Stamp::of(&meta)))
            })
            .collect();
        let found = candidates.len() as u64;
        {
            // A process that stops cleanly removes its file: forget it, and its series go at
            // once.
            let present: HashSet<&str> = candidates.iter().map(|(n, ..)| n.as_str()).collect();
            self.files.retain(|name, _| present.contains(name.as_str()));
        }
        // Files nobody wrote for longer than any writer's staleness cannot be exported: leave
        // them unopened, so hundreds left behind by killed engines cost nothing. The newest
        // come first, so the cap below never hides a live engine behind dead ones.
        candidates.retain(|(_, modified, _)| *modified >= horizon);
        candidates.sort_by(newest_first);
        let skipped = match candidates.len() > self.settings.max_files {
            true => candidates
                .split_off(self.settings.max_files)
                .into_iter()
                .map(|(name, ..)| name)
                .collect(),
            false => Vec::new(),
        };
        Ok(Listing {
            dir_stamp,
            listed_at: std::time::Instant::now(),
            found,
            candidates,
            skipped,
        })
    }
}
