//! The flags every serving command shares (`--listen`, `--interval`) and the parsing behind
//! them, so `gpumem demo` and `gpumem serve` accept and reject exactly the same input.

use crate::sampler::MIN_INTERVAL;
use clap::Args;
use std::net::SocketAddr;
use std::time::Duration;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9400";

/// `--listen` and `--interval`, raw; [`ExporterFlags::validate`] turns them into settings.
#[derive(Args, Debug, Clone)]
pub struct ExporterFlags {
    /// Address to serve /metrics, the status page and the JSON API on (port 0 picks a free port).
    #[arg(long, env = "GPUMEM_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: String,

    /// How often to sample the devices and pools (e.g. 500ms, 1s, 2m; at least 100ms).
    #[arg(long, env = "GPUMEM_INTERVAL", default_value = "1s")]
    pub interval: String,

    /// How many tags per device get their own `gpumem_tag_*{tag}` series (the largest by bytes);
    /// the rest are summed as tag="other", so the number of series stays fixed (1 to 100).
    #[arg(long, env = "GPUMEM_TOP_TAGS", default_value_t = 10)]
    pub top_tags: usize,

    /// Where the status page's hints link to: the URL of docs/runbook.md wherever you host it
    /// (section anchors are appended). Default: the copy this gpumem serves at /runbook.
    #[arg(long, env = "GPUMEM_RUNBOOK_URL", value_name = "URL")]
    pub runbook_url: Option<String>,
}

impl ExporterFlags {
    /// The address and interval, or one line naming the flag that is wrong.
    pub fn validate(&self) -> Result<(SocketAddr, Duration), String> {
        let listen = parse_listen(&self.listen).map_err(|e| format!("--listen: {e}"))?;
        let interval = parse_interval(&self.interval).map_err(|e| format!("--interval: {e}"))?;
        Ok((listen, interval))
    }

    /// `--top-tags`, checked.
    pub fn top_tags(&self) -> Result<usize, String> {
        if (1..=MAX_TOP_TAGS).contains(&self.top_tags) {
            Ok(self.top_tags)
        } else {
            Err(format!(
                "--top-tags: {} is out of range (1 to {MAX_TOP_TAGS})",
                self.top_tags
            ))
        }
    }
}

/// More tags than this per device would make `/metrics` large for little insight.
pub const MAX_TOP_TAGS: usize = 100;

/// An IP address and port such as `127.0.0.1:9400` or `[::1]:9400`.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("'{text}' is not an address with a port, such as 127.0.0.1:9400 or 0.0.0.0:9400")
    })
}

/// A sampling interval: a duration of at least [`MIN_INTERVAL`].
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < MIN_INTERVAL {
        return Err(format!(
            "'{text}' is too short; the shortest interval is {}",
            format_duration(MIN_INTERVAL)
        ));
    }
    Ok(interval)
}

pub use crate::units::{format_duration, parse_duration};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_units_people_write() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration(" 1.5s "), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn bad_durations_say_why() {
        assert!(parse_duration("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("-1s")
            .unwrap_err()
            .contains("not a duration"));
        assert!(parse_duration("3 weeks")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1e999h").is_err());
        assert!(parse_interval("50ms")
            .unwrap_err()
            .contains("shortest interval is 100ms"));
    }

    #[test]
    fn flags_name_the_flag_that_is_wrong() {
        let flags = |listen: &str, interval: &str| ExporterFlags {
            listen: listen.to_string(),
            interval: interval.to_string(),
            top_tags: 10,
            runbook_url: None,
        };
        assert!(flags("127.0.0.1:0", "1s").validate().is_ok());
        let none = ExporterFlags {
            top_tags: 0,
            ..flags("127.0.0.1:0", "1s")
        };
        assert!(none.top_tags().unwrap_err().starts_with("--top-tags:"));
        assert!(flags("localhost", "1s")
            .validate()
            .unwrap_err()
            .starts_with("--listen:"));
        assert!(flags("127.0.0.1:0", "fast")
            .validate()
            .unwrap_err()
            .starts_with("--interval:"));
    }

    #[test]
    fn durations_print_as_flags_take_them() {
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(1)), "1s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
    }
}
