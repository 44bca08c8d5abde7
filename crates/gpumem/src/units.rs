//! Units people type and read: byte sizes ("2G", "512MiB", "4096") and durations ("500ms",
//! "1.5s", "10m"), parsed from input and printed back in the same form.

use std::fmt;
use std::time::Duration;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
pub const TIB: u64 = 1024 * GIB;

/// Parses a byte size such as `4096`, `64K`, `512MiB`, `2G` or `1.5GiB`.
/// Units are binary (K = 1024); `B` and an `i` are optional; case does not matter.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "'{text}' is not a byte size (expected e.g. 4096, 512MiB, 2G)"
        ));
    }
    let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        other => {
            return Err(format!(
                "'{text}' has an unknown unit '{other}' (use B, K, M, G or T, optionally with iB)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a byte size (expected e.g. 4096, 512MiB, 2G)"))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("'{text}' is too large"));
    }
    Ok(bytes.round() as u64)
}

/// A duration such as `500ms`, `1s`, `1.5s`, `2m` or `1h`. A unit is required: a bare `5`
/// could mean seconds or milliseconds, and guessing wrong is worse than asking.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let example = "e.g. 500ms, 1s, 2m or 1h";
    if trimmed.starts_with('-') {
        return Err(format!(
            "'{text}' is negative; a duration is 0 or more ({example})"
        ));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration ({example})"))?;
    let seconds_per_unit = match unit.trim() {
        "ms" => 0.001,
        "s" | "sec" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "" => return Err(format!("'{text}' needs a unit: ms, s, m or h ({example})")),
        other => {
            return Err(format!(
                "'{text}' has an unknown unit '{other}' (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(value * seconds_per_unit)
        .map_err(|_| format!("'{text}' is out of range"))
}

/// A duration for people and flags: "500ms", "1s", "1.5s", "2m", "90m".
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis < 1000 {
        format!("{millis}ms")
    } else if millis.is_multiple_of(60_000) {
        format!("{}m", millis / 60_000)
    } else if millis.is_multiple_of(1000) {
        format!("{}s", millis / 1000)
    } else {
        format!("{:.1}s", duration.as_secs_f64())
    }
}

/// A byte count that prints itself in the largest binary unit that keeps it readable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.0;
        let (unit, scale) = match value {
            v if v >= TIB => ("TiB", TIB),
            v if v >= GIB => ("GiB", GIB),
            v if v >= MIB => ("MiB", MIB),
            v if v >= KIB => ("KiB", KIB),
            _ => return write!(f, "{value} B"),
        };
        write!(f, "{:.2} {unit}", value as f64 / scale as f64)
    }
}

/// Rounds `value` up to a multiple of `align` (a power of two).
#[inline]
pub fn align_up(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (value + align - 1) & !(align - 1)
}

/// Rounds `value` down to a multiple of `align` (a power of two).
#[inline]
pub fn align_down(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    value & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64K"), Ok(64 * KIB));
        assert_eq!(parse_bytes("512MiB"), Ok(512 * MIB));
        assert_eq!(parse_bytes("2G"), Ok(2 * GIB));
        assert_eq!(parse_bytes("1.5gib"), Ok(3 * GIB / 2));
        assert_eq!(parse_bytes(" 80 GB "), Ok(80 * GIB));
    }

    #[test]
    fn rejects_garbage_negative_and_unknown_units() {
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-5").is_err());
        assert!(parse_bytes("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_bytes("1..2G").is_err());
        assert!(parse_bytes("99999999999T")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn prints_readable_sizes() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(2 * MIB).to_string(), "2.00 MiB");
        assert_eq!(Bytes(80 * GIB).to_string(), "80.00 GiB");
    }

    #[test]
    fn aligns_to_powers_of_two() {
        assert_eq!(align_up(1, 512), 512);
        assert_eq!(align_up(512, 512), 512);
        assert_eq!(align_down(4095, 2048), 2048);
    }
}
