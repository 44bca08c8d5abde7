//! Publishing: an engine writes its managers' snapshots into a shared directory (default
//! `/run/gpumem`), one file per process, so that a collector (`gpumem serve --collect-dir`) can
//! export them without the engine opening a port —
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let manager: gpumem::MemoryManager = unimplemented!();
//! let publisher = gpumem_observe::publish::Publisher::builder()
//!     .manager(manager)
//!     .dir("/run/gpumem")
//!     .spawn()?;
//! // ... serve inference ...
//! publisher.shutdown(); // removes the file
//! # Ok(()) }
//! ```
//!
//! The file format (its types live with the snapshot, in [`gpumem_wire::published`], so
//! that a reader needs only the core) is in `docs/publish-format.md`.

mod publisher;

pub use gpumem_wire::published::{file_name, Identity, PublishedFile, FORMAT, VERSION};
pub use publisher::{
    default_dir, PublishError, Publisher, PublisherBuilder, PublisherHandle, DEFAULT_DIR,
};

/// Why `dir` cannot be a directory to write into: it, or the nearest of its parents that
/// exists, is something else (a file). `None` when it is a directory or could be made one;
/// `create_dir_all` would only say "File exists" or "Not a directory" without naming which.
pub fn not_a_directory(dir: &std::path::Path) -> Option<String> {
    let existing = dir
        .ancestors()
        .find(|path| path.symlink_metadata().is_ok())?;
    match std::fs::metadata(existing) {
        Ok(meta) if meta.is_dir() => None,
        Ok(_) => Some(format!("{} is a file, not a directory", existing.display())),
        // A dangling link: creating through it fails with a clear enough error.
        Err(_) => None,
    }
}
