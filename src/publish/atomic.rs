//! Writing a file so that readers see the old content or the new, never half of it: write a
//! temporary file in the same directory, then rename it over the target (atomic on POSIX
//! filesystems within one directory).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Makes temporary names unique between writers of one process (two publishers, tests).
static NEXT_TEMPORARY: AtomicU64 = AtomicU64::new(0);

/// Replaces `dir/name` with `bytes` atomically. The temporary file is `.name.PID.N.tmp`: hidden
/// and not `*.json`, so collectors never read it; it is removed again when anything fails.
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let serial = NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed);
    let temporary = dir.join(format!(".{name}.{}.{serial}.tmp", std::process::id()));
    let written = File::create(&temporary)
        .and_then(|mut file| {
            readable_by_all(&file)?;
            file.write_all(bytes)
        })
        // No fsync: atomicity towards readers comes from the rename alone; durability across a
        // power cut does not matter for a file that is rewritten every second.
        .and_then(|()| std::fs::rename(&temporary, dir.join(name)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// The sidecar reading the file usually runs as another user: make it 0644 whatever the
/// umask (a umask of 077 would otherwise hide every snapshot from it).
#[cfg(unix)]
fn readable_by_all(file: &File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn readable_by_all(_: &File) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_nothing_behind() {
        let missing = std::env::temp_dir().join(format!("gpumem-missing-{}", std::process::id()));
        assert!(write_atomically(&missing, "x.json", b"{}").is_err());
        assert!(!missing.exists());
    }

    #[cfg(unix)]
    #[test]
    fn files_are_readable_by_other_users() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gpumem-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        write_atomically(&dir, "x.json", b"{}").expect("write");
        let mode = std::fs::metadata(dir.join("x.json"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        let _ = std::fs::remove_dir_all(dir);
    }
}
