//! The flags every serving command shares (`--listen`, `--interval`), raw as clap parses them,
//! validated into the exporter's settings so `gpumem demo` and `gpumem serve` agree.

use clap::Args;
use gpumem_observe::exporter::{parse_interval, parse_listen, DEFAULT_LISTEN};
use std::net::SocketAddr;
use std::time::Duration;

/// `--listen` and `--interval`, raw; [`ExporterFlags::validate`] turns them into settings.
#[derive(Args, Debug, Clone)]
pub(super) struct ExporterFlags {
    /// Address to serve /metrics, the status page and the JSON API on (port 0 picks a free port).
    #[arg(long, env = "GPUMEM_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: String,

    /// How often to sample the devices and pools (e.g. 500ms, 1s, 2m; at least 100ms).
    #[arg(long, env = "GPUMEM_INTERVAL", default_value = "1s")]
    pub interval: String,

    /// Host names browsers and scrapers may use to reach the endpoints, comma-separated,
    /// besides IP addresses and localhost (e.g. gpumem.monitoring.svc; * for any). Other names
    /// are refused, so a web page cannot read the API through DNS rebinding.
    #[arg(
        long,
        env = "GPUMEM_ALLOWED_HOSTS",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    pub allowed_hosts: Vec<String>,

    /// How many tags per device get their own `gpumem_tag_*{tag}` series (the largest by bytes);
    /// the rest are summed as tag="other", so the number of series stays fixed (1 to 100).
    #[arg(long, env = "GPUMEM_TOP_TAGS", default_value_t = 10)]
    pub top_tags: usize,

    /// Where the status page's hints link to: the URL of docs/runbook.md wherever you host it
    /// (section anchors are appended). Default: the copy this gpumem serves at /runbook.
    #[arg(long, env = "GPUMEM_RUNBOOK_URL", value_name = "URL")]
    pub runbook_url: Option<String>,
}

/// More tags than this per device would make `/metrics` large for little insight.
const MAX_TOP_TAGS: usize = 100;

impl ExporterFlags {
    /// The address and interval, or one line naming the flag that is wrong.
    pub(super) fn validate(&self) -> Result<(SocketAddr, Duration), String> {
        let listen = parse_listen(&self.listen).map_err(|e| format!("--listen: {e}"))?;
        let interval = parse_interval(&self.interval).map_err(|e| format!("--interval: {e}"))?;
        Ok((listen, interval))
    }

    /// `--top-tags`, checked.
    pub(super) fn top_tags(&self) -> Result<usize, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_the_flag_that_is_wrong() {
        let flags = |listen: &str, interval: &str| ExporterFlags {
            listen: listen.to_string(),
            interval: interval.to_string(),
            allowed_hosts: Vec::new(),
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
}
