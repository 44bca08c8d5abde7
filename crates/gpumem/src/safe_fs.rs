//! Files in directories other people can write to: opening one to read without following a
//! link or blocking on a FIFO ([`open_regular`], [`read_capped`]), and the one way gpumem
//! writes a file ([`write_atomically`]): a fresh temporary created exclusively next to the
//! target, then renamed over it, refusing targets that are not regular files or that are one of
//! the command's own inputs.

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Opens `path` for reading without following a symlink in its last component and without
/// blocking (a FIFO or a device opens at once), then checks what was opened — not what the
/// directory listing said a moment earlier — is a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|error| match error.raw_os_error() {
            Some(libc::ELOOP) => not_regular(path, "a symbolic link"),
            _ => error,
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(path, describe(kind)));
    }
    Ok(file)
}

/// Opens a file the user named (`--config`, `GPUMEM_CONFIG`, a trace) for reading. Links are
/// followed (a Kubernetes ConfigMap mounts its files as links), but the open does not block — a
/// FIFO with no writer would otherwise wait for ever — and what opened must be a regular file:
/// a FIFO, a device or a directory is refused at once.
pub fn open_named_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(path, describe(kind)));
    }
    Ok(file)
}

/// Reads at most `limit` bytes of `reader`; `Err(read)` when there is more (`read` is then
/// `limit + 1`), so a device like `/dev/zero` or a growing file costs `limit` bytes, not memory.
pub fn read_capped(reader: impl Read, limit: u64) -> io::Result<Result<Vec<u8>, u64>> {
    read_capped_expecting(reader, limit, 0)
}

/// [`read_capped`] with room for `expected` bytes (a file's size) from the start: a buffer grown
/// as it fills is moved by some allocators, and held twice for that moment.
pub fn read_capped_expecting(
    reader: impl Read,
    limit: u64,
    expected: u64,
) -> io::Result<Result<Vec<u8>, u64>> {
    let mut bytes = Vec::with_capacity(usize::try_from(expected.min(limit)).unwrap_or(0));
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    let read = bytes.len() as u64;
    Ok(if read > limit { Err(read) } else { Ok(bytes) })
}

/// How [`write_atomically`] writes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    /// Files the command read: the target must not be one of them (`--plot in.gz in.gz`).
    pub inputs: Vec<PathBuf>,
    /// `fsync` before the rename (a file written once, kept); a file rewritten every second
    /// does not need it: atomicity towards readers comes from the rename alone.
    pub durable: bool,
}

/// Whether `target` may be replaced: it does not exist, or is a regular file (not a link, a
/// device or a FIFO) that is none of `inputs`. The error says why not.
pub fn check_target(target: &Path, inputs: &[PathBuf]) -> io::Result<()> {
    if target.file_name().is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} does not name a file", target.display()),
        ));
    }
    let meta = match std::fs::symlink_metadata(target) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    if !meta.file_type().is_file() {
        return Err(not_regular(target, describe(meta.file_type())));
    }
    for input in inputs {
        if std::fs::metadata(input).is_ok_and(|m| same_file(&m, &meta)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is also an input ({}); writing it would destroy it",
                    target.display(),
                    input.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Replaces `target` with `bytes` so that readers see the old content or the new, never half:
/// the bytes go to a new hidden file (`.name.PID.N.RANDOM.tmp`, created with `O_EXCL` and
/// `O_NOFOLLOW`, so a name planted in advance is never followed or reused) in the target's own
/// directory, mode 0644 whatever the umask (a sidecar or node agent reading it usually runs as
/// another user), which is then renamed over the target. Nothing is left behind when anything
/// fails.
pub fn write_atomically(target: &Path, bytes: &[u8], options: &WriteOptions) -> io::Result<()> {
    check_target(target, &options.inputs)?;
    let (mut file, temporary) = create_temporary(target)?;
    let written = file
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .and_then(|()| file.write_all(bytes))
        .and_then(|()| {
            if options.durable {
                file.sync_all()
            } else {
                Ok(())
            }
        })
        // Checked again just before the rename: the window for a swap is as short as it gets.
        .and_then(|()| check_target(target, &options.inputs))
        .and_then(|()| std::fs::rename(&temporary, target));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Makes temporary names unique between writers of one process.
static NEXT_TEMPORARY: AtomicU64 = AtomicU64::new(0);

fn create_temporary(target: &Path) -> io::Result<(File, PathBuf)> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut last_error = None;
    for _ in 0..16 {
        let serial = NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed);
        // Unpredictable, so nobody can plant the name in a shared directory beforehand.
        let random = RandomState::new().build_hasher().finish();
        let temporary = dir.join(format!(
            ".{name}.{}.{serial}.{random:016x}.tmp",
            std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temporary)
        {
            Ok(file) => return Ok((file, temporary)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::other("no free temporary name")))
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn not_regular(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is {what}, not a regular file", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(label: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpumem-safe-fs-{label}-{}-{}",
            std::process::id(),
            NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn writes_replace_and_leave_nothing_behind() {
        let dir = scratch("write");
        let path = dir.join("chart.svg");
        write_atomically(&path, b"first", &WriteOptions::default()).expect("write");
        write_atomically(&path, b"second", &WriteOptions::default()).expect("replace");
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 1);
        let missing = dir.join("no/such/dir/chart.svg");
        assert!(write_atomically(&missing, b"x", &WriteOptions::default()).is_err());
        assert!(write_atomically(Path::new("/"), b"x", &WriteOptions::default()).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn links_inputs_and_directories_are_refused() {
        let dir = scratch("refuse");
        let input = dir.join("in.txt");
        std::fs::write(&input, b"input").expect("input");
        let options = WriteOptions {
            inputs: vec![input.clone()],
            durable: false,
        };
        assert!(write_atomically(&input, b"x", &options).is_err());
        let link = dir.join("link.svg");
        std::os::unix::fs::symlink(&input, &link).expect("symlink");
        let err = write_atomically(&link, b"x", &WriteOptions::default()).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(write_atomically(&dir, b"x", &WriteOptions::default()).is_err());
        assert_eq!(std::fs::read(&input).expect("read"), b"input");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_are_readable_by_other_users() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("mode");
        let path = dir.join("x.json");
        write_atomically(&path, b"{}", &WriteOptions::default()).expect("write");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reading_refuses_links_and_caps_devices() {
        let dir = scratch("read");
        let file = dir.join("f");
        std::fs::write(&file, b"data").expect("file");
        let link = dir.join("l");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        assert!(open_regular(&file).is_ok());
        assert!(open_regular(&link).is_err());
        assert!(open_regular(&dir).is_err());
        let zero = File::open("/dev/zero").expect("/dev/zero");
        assert_eq!(read_capped(zero, 1000).expect("read"), Err(1001));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
