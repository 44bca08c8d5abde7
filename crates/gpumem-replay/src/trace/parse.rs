//! The line parser behind `load_trace`/`parse_trace`: one reused line buffer, ids renumbered
//! to dense slots through a `HashMap`, live bytes tracked for the requested-bytes peak.

use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufRead, Read};

use super::{LineError, Trace, TraceError, TraceEvent};

/// Sizes above this are taken as a corrupt trace rather than a real request.
const MAX_SIZE: u64 = 1 << 40;
/// Most events (or allocations) a metadata hint may make us reserve room for up front.
const MAX_RESERVE: usize = 1 << 24;
/// Longest line read (a trace's lines are tens of bytes): a file that is not a trace, with no
/// newline in sight, is rejected instead of being read into memory whole.
const MAX_LINE: usize = 64 * 1024;
/// How much of a bad token an error quotes.
const QUOTED: usize = 40;
const ALLOC_USAGE: &str = "a <id> <size> <stream>";
const FREE_USAGE: &str = "f <id>";

/// Parses every line of `reader`; `label` names the source in errors.
pub(super) fn parse(
    label: &str,
    name: String,
    mut reader: impl BufRead,
) -> Result<Trace, TraceError> {
    let mut state = State::default();
    let mut buf = Vec::with_capacity(128);
    let mut line = 0usize;
    loop {
        buf.clear();
        let read = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|source| TraceError::Read {
                file: label.to_string(),
                line: line + 1,
                source,
            })?;
        if read == 0 {
            break;
        }
        line += 1;
        if buf.len() > MAX_LINE && buf.last() != Some(&b'\n') {
            return Err(TraceError::Line {
                file: label.to_string(),
                line,
                reason: LineError::TooLong(MAX_LINE),
            });
        }
        // Editors on Windows start UTF-8 files with a byte order mark: not part of the op.
        let text = if line == 1 {
            buf.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&buf)
        } else {
            &buf
        };
        state.line(line, text).map_err(|reason| TraceError::Line {
            file: label.to_string(),
            line,
            reason: match reason {
                // Until one event has been read, the file is not known to be a trace: a line
                // that is no event is not quoted (it may be any file the user can read).
                LineError::UnknownOp(_) if state.events.is_empty() => LineError::NotATrace,
                reason => reason,
            },
        })?;
    }
    if state.events.is_empty() {
        return Err(TraceError::NoEvents {
            file: label.to_string(),
            lines: line,
        });
    }
    Ok(Trace {
        name,
        metadata: state.metadata,
        slots: state.sizes.len(),
        events: state.events,
        peak_requested_bytes: state.peak,
    })
}

#[derive(Default)]
struct State {
    metadata: Option<serde_json::Value>,
    events: Vec<TraceEvent>,
    /// File id -> slot.
    ids: HashMap<u64, u32, BuildHasherDefault<IdHasher>>,
    /// Requested size per slot; 0 once freed (a live size is never 0).
    sizes: Vec<u64>,
    /// Up to u32::MAX live sizes of up to 2^40 bytes each: more than a u64 holds.
    live: u128,
    peak: u64,
}

impl State {
    fn line(&mut self, number: usize, raw: &[u8]) -> Result<(), LineError> {
        let text = std::str::from_utf8(raw).map_err(|_| LineError::InvalidUtf8)?;
        let mut fields = text.split_ascii_whitespace();
        let Some(op) = fields.next() else {
            return Ok(()); // blank line
        };
        match op {
            "a" => {
                let id = number_field(fields.next(), ALLOC_USAGE, "id")?;
                let size = number_field(fields.next(), ALLOC_USAGE, "size")?;
                let stream = number_field(fields.next(), ALLOC_USAGE, "stream")?;
                no_more(fields.next(), ALLOC_USAGE)?;
                self.alloc(id, size, stream)
            }
            "f" => {
                let id = number_field(fields.next(), FREE_USAGE, "id")?;
                no_more(fields.next(), FREE_USAGE)?;
                self.free(id)
            }
            _ if op.starts_with('#') => {
                if number == 1 {
                    self.metadata(text)?;
                }
                Ok(())
            }
            _ => Err(LineError::UnknownOp(quoted(op))),
        }
    }

    /// A first line `# {...}` carries metadata; any other comment is ignored.
    fn metadata(&mut self, text: &str) -> Result<(), LineError> {
        let body = text.trim_start().trim_start_matches('#').trim();
        if !body.starts_with('{') {
            return Ok(());
        }
        let value: serde_json::Value =
            serde_json::from_str(body).map_err(|e| LineError::BadMetadata(e.to_string()))?;
        // The recorder writes the counts: reserve once instead of growing (and rehashing).
        let hint = |key: &str| {
            value
                .get(key)
                .and_then(serde_json::Value::as_u64)
                .map_or(0, |n| {
                    usize::try_from(n).map_or(MAX_RESERVE, |n| n.min(MAX_RESERVE))
                })
        };
        self.events.reserve(hint("events"));
        self.ids.reserve(hint("allocs"));
        self.sizes.reserve(hint("allocs"));
        self.metadata = Some(value);
        Ok(())
    }

    fn alloc(&mut self, id: u64, size: u64, stream: u64) -> Result<(), LineError> {
        if size == 0 {
            return Err(LineError::ZeroSize(id));
        }
        if size > MAX_SIZE {
            return Err(LineError::AbsurdSize { id, size });
        }
        let slot = u32::try_from(self.sizes.len()).map_err(|_| LineError::TooManyIds)?;
        match self.ids.entry(id) {
            Entry::Occupied(_) => return Err(LineError::DuplicateId(id)),
            Entry::Vacant(entry) => {
                entry.insert(slot);
            }
        }
        self.sizes.push(size);
        self.events.push(TraceEvent::Alloc { slot, size, stream });
        self.live += u128::from(size);
        self.peak = self.peak.max(u64::try_from(self.live).unwrap_or(u64::MAX));
        Ok(())
    }

    fn free(&mut self, id: u64) -> Result<(), LineError> {
        let slot = *self.ids.get(&id).ok_or(LineError::UnknownId(id))?;
        let size = match self.sizes.get_mut(slot as usize) {
            Some(size) if *size != 0 => std::mem::take(size),
            _ => return Err(LineError::DoubleFree(id)),
        };
        self.live -= u128::from(size);
        self.events.push(TraceEvent::Free { slot });
        Ok(())
    }
}

/// An unsigned decimal field: digits only (no sign, no '+'), at most `u64::MAX`.
fn number_field(
    text: Option<&str>,
    usage: &'static str,
    field: &'static str,
) -> Result<u64, LineError> {
    let text = text.ok_or(LineError::MissingField { usage, field })?;
    let mut value: u64 = 0;
    for byte in text.bytes() {
        let digit = byte.wrapping_sub(b'0');
        let next = if digit <= 9 {
            value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit)))
        } else {
            None
        };
        value = next.ok_or_else(|| bad_number(text, field))?;
    }
    Ok(value)
}

fn bad_number(text: &str, field: &'static str) -> LineError {
    let negative = text
        .strip_prefix('-')
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()));
    let text = quoted(text);
    if negative {
        LineError::Negative { field, text }
    } else {
        LineError::NotANumber { field, text }
    }
}

fn no_more(extra: Option<&str>, usage: &'static str) -> Result<(), LineError> {
    match extra {
        None => Ok(()),
        Some(text) => Err(LineError::ExtraField {
            usage,
            text: quoted(text),
        }),
    }
}

/// A token for an error message: whole if short, else its start and an ellipsis (a line may
/// be 64 KiB of one token when the file is not a trace at all).
fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// Hashes allocation ids: a multiply and a fold, far cheaper than SipHash over the 140k+ ids
/// of a trace. Not collision-resistant against crafted ids; a trace is a local file.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 32);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
