//! Reading one published file, trusting nothing: its size is capped before reading, the header
//! (`format`, `version`) is checked before the body is parsed, and the body is validated so that
//! no file can add unbounded label values or duplicate series. Every way a file can be wrong is
//! a [`Rejection`] with a bounded reason (a metric label), never a panic.

use gpumem::manager::{clean_tag, MAX_TAG_CHARS};
use gpumem::safe_fs::{open_regular, read_capped_expecting};
use gpumem_wire::process::{clean_process_name, clean_text};
use gpumem_wire::published::{PublishedFile, FORMAT, VERSION};
use serde::Deserialize;
use std::path::Path;

/// Files above this are not read: a snapshot of 64 devices with every pool is far below it.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// Devices per file, pools per device: far above real hardware, small enough for a scrape.
pub const MAX_DEVICES: usize = 64;
pub const MAX_POOLS: usize = 16;
/// Pool names are labels: short, lowercase, from a small alphabet.
pub const MAX_POOL_NAME: usize = 32;
pub const MAX_UUID: usize = 128;
/// Free text from a file (device names, the writer) is cut to this many characters.
pub const MAX_TEXT: usize = 128;
/// How much of a file's own text a rejection quotes: log lines and the page stay short
/// whatever the file holds (a wrong-typed 3 MB string is quoted in serde's message).
const MAX_DETAIL: usize = 240;
/// Tags per device and the length of a tag: a collector exports only the largest few of them
/// (`gpumem_tag_*`), but a file must not make it hold or sort thousands.
pub const MAX_TAGS: usize = 64;
pub const MAX_TAG_NAME: usize = MAX_TAG_CHARS;

/// Every reason a file can be skipped for (metric label values): the [`Rejection`] kinds, plus
/// the collect directory's own `duplicate_pid`, `too_many_files` and `over_budget`.
pub const REJECTION_REASONS: [&str; 10] = [
    "empty",
    "too_large",
    "truncated",
    "not_json",
    "invalid",
    "newer_version",
    "unreadable",
    "duplicate_pid",
    "too_many_files",
    "over_budget",
];

/// Why a file was skipped.
#[derive(Debug)]
pub enum Rejection {
    Empty,
    TooLarge {
        bytes: u64,
    },
    /// Ends in the middle of the JSON: a writer that does not write atomically, caught mid-write.
    Truncated(String),
    NotJson(String),
    /// JSON, but not a valid gpumem.publish file of a version we read.
    Invalid(String),
    NewerVersion(u32),
    Unreadable(std::io::Error),
}

impl Rejection {
    /// The metric label for this kind of rejection (a fixed, small set).
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::Empty => "empty",
            Rejection::TooLarge { .. } => "too_large",
            Rejection::Truncated(_) => "truncated",
            Rejection::NotJson(_) => "not_json",
            Rejection::Invalid(_) => "invalid",
            Rejection::NewerVersion(_) => "newer_version",
            Rejection::Unreadable(_) => "unreadable",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Empty => write!(f, "the file is empty"),
            Rejection::TooLarge { bytes } => write!(
                f,
                "the file is {bytes} bytes; the limit is {MAX_FILE_BYTES}"
            ),
            Rejection::Truncated(detail) => write!(f, "the file ends early ({})", short(detail)),
            Rejection::NotJson(detail) => write!(f, "not JSON ({})", short(detail)),
            Rejection::Invalid(detail) => {
                write!(f, "not a valid {FORMAT} file: {}", short(detail))
            }
            Rejection::NewerVersion(version) => write!(
                f,
                "format version {version} is newer than this gpumem reads ({VERSION}); upgrade the sidecar"
            ),
            Rejection::Unreadable(error) => write!(f, "cannot read it: {error}"),
        }
    }
}

/// `detail` cut to [`MAX_DETAIL`] characters, control characters escaped.
fn short(detail: &str) -> String {
    let mut out: String = detail
        .chars()
        .take(MAX_DETAIL)
        .map(|c| if c.is_control() { '_' } else { c })
        .collect();
    if detail.chars().nth(MAX_DETAIL).is_some() {
        out.push('…');
    }
    out
}

/// What is read before the body: enough to refuse a file of another format or a newer version
/// without misreading it.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u32>,
    /// Counted, not built: a file past the entry caps is refused before its entries cost
    /// memory (150k devices in 4 MiB took 227 MiB and most of a core to build, every scan).
    #[serde(default)]
    #[allow(dead_code)]
    devices: Option<Counted<Devices>>,
}

/// What of a device is counted before it is parsed: its pools and tags.
#[derive(Deserialize)]
struct DeviceShape {
    #[serde(default)]
    #[allow(dead_code)]
    pools: Option<Counted<Pools>>,
    #[serde(default)]
    #[allow(dead_code)]
    tags: Option<Counted<Tags>>,
}

/// An array the header pass counts: what its entries are called, how many may be, and the
/// shape read of each (nothing kept).
trait Entries {
    const WHAT: &'static str;
    const CAP: usize;
    type Shape: for<'de> Deserialize<'de>;
}

struct Devices;
struct Pools;
struct Tags;

impl Entries for Devices {
    const WHAT: &'static str = "devices";
    const CAP: usize = MAX_DEVICES;
    type Shape = DeviceShape;
}

impl Entries for Pools {
    const WHAT: &'static str = "pools on one device";
    const CAP: usize = MAX_POOLS;
    type Shape = serde::de::IgnoredAny;
}

impl Entries for Tags {
    const WHAT: &'static str = "tags on one device";
    const CAP: usize = MAX_TAGS;
    type Shape = serde::de::IgnoredAny;
}

/// An array of at most `E::CAP` entries, read without keeping them; one more is an error at
/// once (the rest of the file is not read).
struct Counted<E>(std::marker::PhantomData<E>);

impl<'de, E: Entries> Deserialize<'de> for Counted<E> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<E>(std::marker::PhantomData<E>);
        impl<'de, E: Entries> serde::de::Visitor<'de> for Visit<E> {
            type Value = Counted<E>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "an array of at most {} {}", E::CAP, E::WHAT)
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut count = 0usize;
                while seq.next_element::<E::Shape>()?.is_some() {
                    count += 1;
                    if count > E::CAP {
                        return Err(serde::de::Error::custom(format!(
                            "more than {} {}; at most {}",
                            E::CAP,
                            E::WHAT,
                            E::CAP
                        )));
                    }
                }
                Ok(Counted(std::marker::PhantomData))
            }
        }
        deserializer.deserialize_seq(Visit::<E>(std::marker::PhantomData))
    }
}

/// Reads, parses and validates one file. The file is opened without following a link and
/// without blocking, and must be a regular file once open: a writer that swaps in a FIFO or a
/// symlink after the directory was listed gets an `unreadable` rejection, not a stuck collector
/// or a file from outside the directory.
pub fn read_file(path: &Path, max_bytes: u64) -> Result<PublishedFile, Rejection> {
    read_sized(path, max_bytes).map(|(file, _)| file)
}

/// [`read_file`], with the number of bytes read.
pub fn read_sized(path: &Path, max_bytes: u64) -> Result<(PublishedFile, u64), Rejection> {
    let file = open_regular(path).map_err(Rejection::Unreadable)?;
    let size = file.metadata().map_err(Rejection::Unreadable)?.len();
    if size > max_bytes {
        return Err(Rejection::TooLarge { bytes: size });
    }
    // The file may grow between the size check and the read: never read past the cap.
    match read_capped_expecting(file, max_bytes, size).map_err(Rejection::Unreadable)? {
        Ok(bytes) => parse(&bytes).map(|file| (file, bytes.len() as u64)),
        Err(bytes) => Err(Rejection::TooLarge { bytes }),
    }
}

/// Parses and validates the bytes of one file.
pub fn parse(bytes: &[u8]) -> Result<PublishedFile, Rejection> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Rejection::Empty);
    }
    let header: Header = serde_json::from_slice(bytes).map_err(json_rejection)?;
    if header.format.as_deref() != Some(FORMAT) {
        return Err(Rejection::Invalid(match header.format {
            Some(other) => format!("\"format\" is \"{other}\", not \"{FORMAT}\""),
            None => format!("no \"format\": \"{FORMAT}\" field"),
        }));
    }
    match header.version {
        Some(version) if version > VERSION => return Err(Rejection::NewerVersion(version)),
        Some(0) | None => {
            return Err(Rejection::Invalid(
                "\"version\" must be a positive integer".into(),
            ))
        }
        Some(_) => {}
    }
    let mut file: PublishedFile = serde_json::from_slice(bytes).map_err(json_rejection)?;
    validate(&mut file).map_err(Rejection::Invalid)?;
    Ok(file)
}

fn json_rejection(error: serde_json::Error) -> Rejection {
    use serde_json::error::Category;
    let detail = error.to_string();
    match error.classify() {
        Category::Eof => Rejection::Truncated(detail),
        Category::Syntax => Rejection::NotJson(detail),
        Category::Data | Category::Io => Rejection::Invalid(detail),
    }
}

/// Checks what serde cannot: value ranges, label values, duplicates. Cleans the process name.
fn validate(file: &mut PublishedFile) -> Result<(), String> {
    if file.pid == 0 {
        return Err("\"pid\" must be positive".into());
    }
    if !(file.timestamp_seconds.is_finite() && file.timestamp_seconds > 0.0) {
        return Err("\"timestamp_seconds\" must be a positive number".into());
    }
    if let Some(interval) = file.interval_seconds {
        if !(interval.is_finite() && interval > 0.0) {
            return Err("\"interval_seconds\" must be a positive number".into());
        }
    }
    file.process = clean_process_name(&file.process);
    file.writer = file.writer.as_deref().map(|w| clean_text(w, MAX_TEXT));
    // Compared with the collector's own, never shown: a long one cannot match anything.
    if file
        .pid_namespace
        .as_ref()
        .is_some_and(|ns| ns.len() > MAX_TEXT)
    {
        file.pid_namespace = None;
    }
    if file.devices.len() > MAX_DEVICES {
        return Err(format!(
            "{} devices; at most {MAX_DEVICES}",
            file.devices.len()
        ));
    }
    let mut gpus = Vec::with_capacity(file.devices.len());
    for device in &mut file.devices {
        device.name = device.name.as_deref().map(|n| clean_text(n, MAX_TEXT));
        // The in-process rule (`gpumem::manager::clean_tag`): a tag an engine could not have
        // published through gpumem is cut and cleaned the same way, not refused.
        if device.tags.len() <= MAX_TAGS {
            for tag in &mut device.tags {
                tag.tag = clean_tag(&tag.tag);
            }
        }
    }
    for device in &file.devices {
        let gpu = device.gpu;
        if gpus.contains(&gpu) {
            return Err(format!("gpu {gpu} is listed twice"));
        }
        gpus.push(gpu);
        if let Some(uuid) = &device.uuid {
            if uuid.len() > MAX_UUID || !uuid.chars().all(|c| c.is_ascii_graphic()) {
                return Err(format!("gpu {gpu}: \"uuid\" is not a device UUID"));
            }
        }
        if device
            .oldest_allocation_age_seconds
            .is_some_and(|age| !(age.is_finite() && age >= 0.0))
        {
            return Err(format!(
                "gpu {gpu}: \"oldest_allocation_age_seconds\" is negative"
            ));
        }
        if let Some(memory) = &device.device_memory {
            if memory.free_bytes > memory.total_bytes {
                return Err(format!(
                    "gpu {gpu}: \"device_memory\": free_bytes is above total_bytes"
                ));
            }
            if memory.pressure_level.is_some_and(|l| l > 3)
                || memory
                    .pressure_used_ratio
                    .is_some_and(|r| !(r.is_finite() && r >= 0.0))
            {
                return Err(format!(
                    "gpu {gpu}: \"device_memory\": pressure_level must be 0 to 3 and \
                     pressure_used_ratio a non-negative number"
                ));
            }
        }
        if device.pools.len() > MAX_POOLS {
            return Err(format!(
                "gpu {gpu}: {} pools; at most {MAX_POOLS}",
                device.pools.len()
            ));
        }
        validate_tags(gpu, &device.tags)?;
        let mut names: Vec<&str> = Vec::with_capacity(device.pools.len());
        for pool in &device.pools {
            let name = pool.pool.as_str();
            let well_formed = !name.is_empty()
                && name.len() <= MAX_POOL_NAME
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !well_formed {
                return Err(format!(
                    "gpu {gpu}: pool name \"{}\" must be 1 to {MAX_POOL_NAME} of a-z, 0-9 and _",
                    name.escape_debug()
                ));
            }
            if names.contains(&name) {
                return Err(format!("gpu {gpu}: pool \"{name}\" is listed twice"));
            }
            names.push(name);
            if pool
                .fragmentation_ratio
                .is_some_and(|r| !(r.is_finite() && (0.0..=1.0).contains(&r)))
            {
                return Err(format!(
                    "gpu {gpu}: pool \"{name}\": \"fragmentation_ratio\" must be within 0 and 1"
                ));
            }
        }
    }
    Ok(())
}

/// A device's tags: few, each once (they become `tag` label values); already cleaned, so
/// short and printable, and not empty.
fn validate_tags(gpu: u32, tags: &[gpumem_wire::ProcessTag]) -> Result<(), String> {
    if tags.len() > MAX_TAGS {
        return Err(format!(
            "gpu {gpu}: {} tags; at most {MAX_TAGS}",
            tags.len()
        ));
    }
    let mut seen: Vec<&str> = Vec::with_capacity(tags.len());
    for tag in tags {
        let name = tag.tag.as_str();
        if name.is_empty() {
            return Err(format!(
                "gpu {gpu}: a tag is empty (or only control and invisible characters)"
            ));
        }
        if seen.contains(&name) {
            return Err(format!("gpu {gpu}: tag \"{name}\" is listed twice"));
        }
        seen.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"format":"gpumem.publish","version":1,"pid":42,"process":"python3",
        "timestamp_seconds":1700000000.0,"devices":[{"gpu":0,"reserved_bytes":1024,
        "pools":[{"pool":"large","reserved_bytes":1024}]}]}"#;

    fn reason(bytes: &str) -> &'static str {
        match parse(bytes.as_bytes()) {
            Ok(_) => "ok",
            Err(rejection) => rejection.reason(),
        }
    }

    #[test]
    fn a_minimal_file_parses() {
        let file = parse(GOOD.as_bytes()).expect("valid");
        assert_eq!((file.pid, file.process.as_str()), (42, "python3"));
        assert_eq!(file.devices[0].reserved_bytes, Some(1024));
        assert_eq!(file.devices[0].in_use_bytes, None, "missing means unknown");
    }

    #[test]
    fn every_kind_of_bad_file_has_its_reason() {
        assert_eq!(reason(""), "empty");
        assert_eq!(reason(" \n"), "empty");
        assert_eq!(reason(&GOOD[..GOOD.len() / 2]), "truncated");
        assert_eq!(reason("\u{1}\u{2}garbage"), "not_json");
        assert_eq!(reason("[1, 2]"), "invalid");
        assert_eq!(reason(r#"{"format":"other","version":1}"#), "invalid");
        assert_eq!(reason(r#"{"format":"gpumem.publish"}"#), "invalid");
        assert_eq!(
            reason(r#"{"format":"gpumem.publish","version":2,"anything":[]}"#),
            "newer_version"
        );
        assert_eq!(reason(&GOOD.replace("\"pid\":42", "\"pid\":-1")), "invalid");
        assert_eq!(reason(&GOOD.replace("1024,\n", "\"lots\",\n")), "invalid");
    }

    #[test]
    fn labels_cannot_be_abused() {
        let bad_pool = GOOD.replace("\"pool\":\"large\"", "\"pool\":\"Large Pool!\"");
        assert_eq!(reason(&bad_pool), "invalid");
        let twice = GOOD.replace(
            r#"[{"gpu":0,"reserved_bytes":1024,"#,
            r#"[{"gpu":0},{"gpu":0,"reserved_bytes":1024,"#,
        );
        assert_eq!(reason(&twice), "invalid");
        let long_name = GOOD.replace("python3", &"p".repeat(500));
        let file = parse(long_name.as_bytes()).expect("names are cut, not refused");
        assert_eq!(file.process.len(), gpumem_wire::process::MAX_PROCESS_NAME);
    }

    #[test]
    fn tags_are_optional_and_bounded() {
        let file = parse(GOOD.as_bytes()).expect("a version-1 file without tags");
        assert!(file.devices[0].tags.is_empty());
        let tagged = GOOD.replace(
            "\"pools\":[",
            "\"tags\":[{\"tag\":\"kv_cache\",\"live_bytes\":512}],\"pools\":[",
        );
        let file = parse(tagged.as_bytes()).expect("tags parse");
        assert_eq!(file.devices[0].tags[0].live_bytes, Some(512));
        let twice = tagged.replace(
            "[{\"tag\":\"kv_cache\",",
            "[{\"tag\":\"kv_cache\"},{\"tag\":\"kv_cache\",",
        );
        assert_eq!(reason(&twice), "invalid");
        assert_eq!(reason(&tagged.replace("kv_cache", "")), "invalid");
        // The in-process rule: control characters replaced, bidi ones removed, cut to 64.
        let hostile = tagged.replace(
            "kv_cache",
            &format!("kv\\u001b[2J\\u202ecache{}", "x".repeat(200)),
        );
        let file = parse(hostile.as_bytes()).expect("cleaned, not refused");
        let name = &file.devices[0].tags[0].tag;
        assert!(name.starts_with("kv_[2Jcache"), "{name}");
        assert_eq!(name.chars().count(), MAX_TAG_NAME);
        assert_eq!(reason(&tagged.replace("kv_cache", "\\u202e")), "invalid");
    }

    #[test]
    fn the_device_as_the_writer_reads_it_is_checked() {
        let with = |memory: &str| {
            GOOD.replace(
                "\"pools\":[",
                &format!("\"device_memory\":{memory},\"pools\":["),
            )
        };
        let file = parse(
            with(r#"{"total_bytes":100,"free_bytes":4,"pressure_level":3,"pressure_used_ratio":0.97}"#)
                .as_bytes(),
        )
        .expect("valid");
        let memory = file.devices[0].device_memory.clone().expect("read");
        assert_eq!((memory.total_bytes, memory.pressure_level), (100, Some(3)));
        for bad in [
            r#"{"total_bytes":1,"free_bytes":4}"#,
            r#"{"total_bytes":100,"free_bytes":4,"pressure_level":4}"#,
            r#"{"total_bytes":100,"free_bytes":4,"pressure_used_ratio":-1}"#,
        ] {
            assert_eq!(reason(&with(bad)), "invalid", "{bad}");
        }
    }

    #[test]
    fn unknown_fields_are_ignored_for_forward_compatibility() {
        let extra = GOOD.replace("\"pid\":42", "\"pid\":42,\"future_field\":{\"x\":1}");
        assert_eq!(reason(&extra), "ok");
    }
}
