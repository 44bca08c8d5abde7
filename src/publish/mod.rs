//! Publishing: an engine writes its managers' snapshots into a shared directory (default
//! `/run/gpumem`), one file per process, so that a sidecar (`gpumem serve --collect-dir`) can
//! export them without the engine opening a port —
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let manager: gpumem::MemoryManager = unimplemented!();
//! let publisher = gpumem::publish::Publisher::builder()
//!     .manager(manager)
//!     .dir("/run/gpumem")
//!     .spawn()?;
//! // ... serve inference ...
//! publisher.shutdown(); // removes the file
//! # Ok(()) }
//! ```
//!
//! The file format is in [`mod@format`] and `docs/publish-format.md`; [`process`] reads `/proc`.

pub mod format;
pub mod process;
mod publisher;

pub use format::{file_name, Identity, PublishedFile, FORMAT, VERSION};
pub use publisher::{
    default_dir, PublishError, Publisher, PublisherBuilder, PublisherHandle, DEFAULT_DIR,
};
