//! The node agent's credential files, the CA bundle and the ServiceAccount token, read as
//! `--config` is: links followed (Kubernetes mounts them as links), opened without blocking (a
//! FIFO would hang), regular files only, size-capped (`/dev/zero` would never end); and which
//! version of a file was read ([`FileStamp`]), so the CA is read again when it changes.

use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::path::Path;

/// A CA bundle is a few KiB of PEM; a file past this is not one (`--kubernetes-ca /dev/zero`).
pub const MAX_CA_BYTES: u64 = 1 << 20;
/// A ServiceAccount token (a JWT) is 1-2 KiB; a file past this is not one.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// Which version of a file: device, inode, size and modification time, as `stat` gives them
/// after following links. Any change means the file is read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    device: u64,
    inode: u64,
    size: u64,
    modified_ns: i128,
}

impl FileStamp {
    pub(super) fn of(path: &Path) -> Option<FileStamp> {
        std::fs::metadata(path).ok().as_ref().map(FileStamp::from)
    }
}

impl From<&std::fs::Metadata> for FileStamp {
    fn from(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// A credential file's bytes and version, read as `--config` is: links followed, opened
/// without blocking, a regular file only, at most `limit` bytes. `what` names it in errors
/// ("the CA file"), each one sentence.
fn read_credential(path: &Path, limit: u64, what: &str) -> Result<(Vec<u8>, FileStamp), String> {
    let shown = path.display();
    let cannot = |e: std::io::Error| format!("cannot read {what} {shown}: {e}");
    let file = gpumem::safe_fs::open_named_regular(path).map_err(|e| {
        // The safe_fs message names the path already.
        match e.kind() {
            std::io::ErrorKind::InvalidInput => format!("cannot read {what}: {e}"),
            _ => cannot(e),
        }
    })?;
    let stamp = FileStamp::from(&file.metadata().map_err(cannot)?);
    let bytes = gpumem::safe_fs::read_capped(file, limit)
        .map_err(cannot)?
        .map_err(|_| {
            format!(
                "{what} {shown} is larger than {}, too large to be one",
                gpumem::units::Bytes(limit)
            )
        })?;
    Ok((bytes, stamp))
}

/// The CA file's certificates as the only roots trusted, and the file's version.
pub(super) fn load_roots(path: &Path) -> Result<(rustls::RootCertStore, FileStamp), String> {
    let shown = path.display();
    let (bytes, stamp) = read_credential(path, MAX_CA_BYTES, "the CA file")?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert = cert.map_err(|e| format!("the CA file {shown} is not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the CA file {shown} holds a bad certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("the CA file {shown} holds no certificate"));
    }
    Ok((roots, stamp))
}

/// The bearer token, trimmed; an empty file is an error.
pub(super) fn read_token(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let (bytes, _) = read_credential(path, MAX_TOKEN_BYTES, "the ServiceAccount token")?;
    let token = String::from_utf8(bytes)
        .map_err(|_| format!("the ServiceAccount token {shown} is not text"))?;
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "the ServiceAccount token {shown} is empty or not a token"
        ));
    }
    Ok(token.to_string())
}
