//! Tests for trace parsing: every rejection names its line; the shared traces' peaks.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;

use super::*;

fn parse(text: &str) -> Result<Trace, TraceError> {
    parse_trace("t.trace", Cursor::new(text.as_bytes()))
}

/// Asserts `text` is rejected at `line` with a message containing `needle`.
fn rejects(text: &str, line: usize, needle: &str) {
    let message = match parse(text) {
        Ok(_) => panic!("accepted: {text:?}"),
        Err(e) => e.to_string(),
    };
    assert!(
        message.starts_with(&format!("t.trace line {line}: ")),
        "wrong line in {message:?}"
    );
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    assert!(!message.contains('\n'), "not one line: {message:?}");
}

#[test]
fn parses_events_slots_and_peak() {
    let text = "# {\"name\": \"x\"}\n\na 100 10 0\na 7 20 1\n# a comment\nf 100\r\na 3 5 0\nf 7\n";
    let trace = parse(text).expect("valid");
    assert_eq!(trace.name, "t.trace");
    assert_eq!(trace.metadata, Some(serde_json::json!({"name": "x"})));
    assert_eq!(trace.slots, 3);
    assert_eq!(trace.peak_requested_bytes, 30);
    assert_eq!(
        trace.events,
        vec![
            TraceEvent::Alloc {
                slot: 0,
                size: 10,
                stream: 0
            },
            TraceEvent::Alloc {
                slot: 1,
                size: 20,
                stream: 1
            },
            TraceEvent::Free { slot: 0 },
            TraceEvent::Alloc {
                slot: 2,
                size: 5,
                stream: 0
            },
            TraceEvent::Free { slot: 1 },
        ]
    );
}

#[test]
fn metadata_is_optional_and_only_on_line_one() {
    let trace = parse("a 1 1 0\n# {\"not\": \"metadata\"}\n").expect("valid");
    assert_eq!(trace.metadata, None);
    let trace = parse("# recorded by hand\na 1 1 0\n").expect("valid");
    assert_eq!(trace.metadata, None);
    rejects("# {not json\na 1 1 0\n", 1, "metadata is not valid JSON");
}

#[test]
fn rejects_unknown_op() {
    rejects("a 1 8 0\nx 1\n", 2, "unknown op 'x'");
}

#[test]
fn a_file_that_is_no_trace_is_not_quoted() {
    let text = "root:x:0:0:secret-hash:/root:/bin/bash\n";
    rejects(text, 1, "not a trace event");
    let error = parse(text).expect_err("not a trace").to_string();
    assert!(
        !error.contains("secret") && !error.contains("root"),
        "{error}"
    );
}

#[test]
fn rejects_missing_fields() {
    rejects("a 1 8\n", 1, "missing field <stream>");
    rejects("a 1 8 0\nf\n", 2, "missing field <id>");
}

#[test]
fn rejects_extra_fields() {
    rejects("a 1 8 0 9\n", 1, "extra field '9'");
    rejects("a 1 8 0\nf 1 2\n", 2, "extra field '2'");
}

#[test]
fn rejects_bad_numbers() {
    rejects(
        "a 1 eight 0\n",
        1,
        "<size> is not an unsigned 64-bit integer: 'eight'",
    );
    rejects("a 1 8 0\na 2 -8 0\n", 2, "<size> is negative: '-8'");
    rejects("a 1 8 0\nf -1\n", 2, "<id> is negative");
    rejects("a +1 8 0\n", 1, "<id> is not an unsigned");
    rejects("a 1 8 1.5\n", 1, "<stream> is not an unsigned");
    rejects("a 99999999999999999999 8 0\n", 1, "<id> is not an unsigned");
}

#[test]
fn rejects_zero_and_absurd_sizes() {
    rejects("a 1 8 0\na 2 0 0\n", 2, "size 0");
    rejects("a 1 1099511627777 0\n", 1, "absurd size");
    assert!(
        parse("a 1 1099511627776 0\n").is_ok(),
        "exactly 1 TiB is allowed"
    );
}

#[test]
fn rejects_free_of_unknown_id() {
    rejects("a 1 8 0\n\nf 42\n", 3, "free of unknown id 42");
}

#[test]
fn rejects_double_free() {
    rejects("a 1 8 0\nf 1\nf 1\n", 3, "free of already freed id 1");
}

#[test]
fn rejects_duplicate_id() {
    rejects("a 1 8 0\na 1 8 0\n", 2, "duplicate allocation id 1");
    // Ids stay unique after a free too.
    rejects("a 1 8 0\nf 1\na 1 8 0\n", 3, "duplicate allocation id 1");
}

#[test]
fn rejects_invalid_utf8() {
    let bytes = b"a 1 8 0\n# caf\xe9\n".to_vec();
    let message = parse_trace("t.trace", Cursor::new(bytes))
        .expect_err("invalid")
        .to_string();
    assert_eq!(message, "t.trace line 2: invalid UTF-8");
}

#[test]
fn rejects_a_trace_without_events() {
    let message = parse("").expect_err("empty").to_string();
    assert_eq!(
        message,
        "t.trace: no allocation events in the trace (read 0 lines)"
    );
    let message = parse("# {}\n\n").expect_err("empty").to_string();
    assert!(message.contains("read 2 lines"), "{message}");
}

fn gzip(text: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(text).expect("in memory");
    encoder.finish().expect("in memory")
}

/// A fresh scratch directory under the system temp directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("gpumem-trace-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scratch(dir)
    }

    fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write scratch file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn loads_gzip_by_magic_and_plain_text_whatever_the_name() {
    let scratch = Scratch::new("load");
    let text = b"# {\"name\": \"g\"}\na 5 100 0\na 6 50 0\nf 5\n";
    // Compressed, but named like plain text.
    let gz = scratch.file("small.trace", &gzip(text));
    let trace = load_trace(&gz).expect("gzip");
    assert_eq!(trace.name, "small");
    assert_eq!(trace.events.len(), 3);
    assert_eq!(trace.peak_requested_bytes, 150);
    // Plain, but named like gzip.
    let plain = scratch.file("plain.trace.gz", text);
    let trace = load_trace(&plain).expect("plain");
    assert_eq!(trace.name, "plain");
    assert_eq!(trace.slots, 2);
}

#[test]
fn load_errors_name_the_path() {
    let scratch = Scratch::new("errors");
    let path = scratch.file("bad.trace.gz", &gzip(b"a 1 8 0\nf 2\n"));
    let message = load_trace(&path).expect_err("bad").to_string();
    assert_eq!(
        message,
        format!("{} line 2: free of unknown id 2", path.display())
    );

    let missing = scratch.0.join("missing.trace.gz");
    let message = load_trace(&missing).expect_err("missing").to_string();
    assert!(
        message.starts_with(&format!("cannot open trace {}: ", missing.display())),
        "{message}"
    );
    assert!(message.contains("No such file"), "{message}");

    let message = load_trace(&scratch.0).expect_err("directory").to_string();
    assert!(message.contains("is a directory"), "{message}");
}

#[test]
fn rejects_truncated_and_corrupt_gzip() {
    let scratch = Scratch::new("gzip");
    let mut text = String::new();
    for id in 0..20_000 {
        text.push_str(&format!("a {id} {} 0\n", id * 7919 % 100_003 + 1));
    }
    let full = gzip(text.as_bytes());

    let cut = scratch.file("cut.trace.gz", &full[..full.len() / 2]);
    let message = load_trace(&cut).expect_err("truncated").to_string();
    let prefix = format!("{} line ", cut.display());
    assert!(message.starts_with(&prefix), "{message}");
    assert!(message.contains("error reading the file"), "{message}");
    let line: usize = message[prefix.len()..]
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a line number");
    assert!(line > 1 && line <= 20_000, "line {line} reached");

    // Only the 8-byte trailer (CRC and length) missing.
    let no_trailer = scratch.file("notrailer.trace.gz", &full[..full.len() - 8]);
    let message = load_trace(&no_trailer).expect_err("no trailer").to_string();
    assert!(message.contains("error reading the file"), "{message}");

    let mut corrupt = full.clone();
    let middle = corrupt.len() / 2;
    for byte in &mut corrupt[middle..middle + 64] {
        *byte ^= 0x5a;
    }
    let path = scratch.file("corrupt.trace.gz", &corrupt);
    let message = load_trace(&path).expect_err("corrupt").to_string();
    assert!(message.contains(" line "), "{message}");
}

/// The repository's traces: the peaks benches/traces/README.md states.
#[test]
fn traces_match_readme_peaks() {
    // The corpus lives at the workspace's root, two levels above this crate.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/traces");
    for (file, events, peak) in [
        ("gpt2_generate.trace.gz", 281_928, 574_953_984),
        ("gpt2_train.trace.gz", 12_121, 3_378_788_456),
    ] {
        let path = dir.join(file);
        let trace = load_trace(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(trace.events.len(), events, "{file} events");
        assert_eq!(trace.peak_requested_bytes, peak, "{file} peak");
        assert!(trace.metadata.is_some(), "{file} metadata");
        assert_eq!(trace.name, file.trim_end_matches(".trace.gz"));
    }
}
