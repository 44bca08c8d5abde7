//! Allocation traces (`benches/traces/README.md`): reading a trace file, plain or gzip, into
//! dense-slot events the replayer can index with a `Vec`, and rejecting malformed input with
//! an error that names the file and line.

mod parse;
#[cfg(test)]
mod tests;

use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

/// A parsed allocation trace.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The file stem without `.trace.gz`, `.gz` or `.trace` (e.g. `gpt2_generate`).
    pub name: String,
    /// The JSON object from a first line `# {...}`, when there is one.
    pub metadata: Option<serde_json::Value>,
    pub events: Vec<TraceEvent>,
    /// Number of distinct allocation ids; every `slot` in `events` is below this.
    pub slots: usize,
    /// Maximum over the trace of the sum of requested sizes live at once.
    pub peak_requested_bytes: u64,
}

/// One trace event. File ids are renumbered to dense slots `0..slots` in order of first
/// appearance, so a replayer can keep its per-allocation state in a `Vec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    Alloc { slot: u32, size: u64, stream: u64 },
    Free { slot: u32 },
}

/// Why a trace could not be read. `Display` is one line naming the file (and line, where
/// there is one), fit to print as-is on stderr.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot open trace {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },

    #[error("{file} line {line}: error reading the file: {source}")]
    Read {
        file: String,
        /// The 1-based line being read when the error struck.
        line: usize,
        #[source]
        source: io::Error,
    },

    #[error("{file} line {line}: {reason}")]
    Line {
        file: String,
        line: usize,
        reason: LineError,
    },

    #[error("{file}: no allocation events in the trace (read {lines} lines)")]
    NoEvents { file: String, lines: usize },
}

/// What was wrong with one line of a trace.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("unknown op '{0}' (expected 'a <id> <size> <stream>' or 'f <id>')")]
    UnknownOp(String),
    /// A bad line before any event: the file may be anything readable (`replay /etc/shadow`),
    /// so its text is not quoted.
    #[error("not a trace event (expected 'a <id> <size> <stream>' or 'f <id>'); is this a gpumem trace?")]
    NotATrace,
    #[error("missing field <{field}> (expected '{usage}')")]
    MissingField {
        usage: &'static str,
        field: &'static str,
    },
    #[error("extra field '{text}' (expected '{usage}')")]
    ExtraField { usage: &'static str, text: String },
    #[error("field <{field}> is negative: '{text}'")]
    Negative { field: &'static str, text: String },
    #[error("field <{field}> is not an unsigned 64-bit integer: '{text}'")]
    NotANumber { field: &'static str, text: String },
    #[error("allocation id {0} has size 0")]
    ZeroSize(u64),
    #[error("allocation id {id} has an absurd size of {size} bytes (limit 1 TiB)")]
    AbsurdSize { id: u64, size: u64 },
    #[error("free of unknown id {0}")]
    UnknownId(u64),
    #[error("free of already freed id {0}")]
    DoubleFree(u64),
    #[error("duplicate allocation id {0}")]
    DuplicateId(u64),
    #[error("more than {} distinct allocation ids", u32::MAX)]
    TooManyIds,
    #[error("invalid UTF-8")]
    InvalidUtf8,
    #[error("line longer than {0} bytes (is this a trace file?)")]
    TooLong(usize),
    #[error("metadata is not valid JSON: {0}")]
    BadMetadata(String),
}

/// Reads a trace file, gzip-compressed (detected by its magic bytes, not its name) or plain.
pub fn load_trace(path: &Path) -> Result<Trace, TraceError> {
    let open_error = |source: io::Error| TraceError::Open {
        path: path.display().to_string(),
        source,
    };
    // A regular file only: a FIFO without a writer would block the replay for ever, and a
    // directory would fail later with a vaguer message.
    let file = gpumem::safe_fs::open_named_regular(path).map_err(open_error)?;
    let label = path.display().to_string();
    let name = trace_name(path);
    let mut file = file;
    let mut magic = [0u8; 2];
    let sniffed = read_up_to(&mut file, &mut magic).map_err(|source| TraceError::Read {
        file: label.clone(),
        line: 1,
        source,
    })?;
    // Put the sniffed bytes back in front of the rest of the file.
    let raw = BufReader::with_capacity(64 * 1024, (&magic[..sniffed]).chain(file));
    if magic[..sniffed] == GZIP_MAGIC {
        let decoder = BufReader::with_capacity(64 * 1024, MultiGzDecoder::new(raw));
        parse::parse(&label, name, decoder)
    } else {
        parse::parse(&label, name, raw)
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Parses a trace from text that is already decompressed. `name` becomes [`Trace::name`] and
/// labels errors.
pub fn parse_trace(name: &str, reader: impl BufRead) -> Result<Trace, TraceError> {
    parse::parse(name, name.to_string(), reader)
}

/// The file name without `.trace.gz`, `.gz` or `.trace`.
fn trace_name(path: &Path) -> String {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    for suffix in [".trace.gz", ".gz", ".trace"] {
        if let Some(stem) = file_name.strip_suffix(suffix) {
            if !stem.is_empty() {
                return stem.to_string();
            }
        }
    }
    file_name
}

/// Fills `buf` as far as the input allows; returns how many bytes were read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
