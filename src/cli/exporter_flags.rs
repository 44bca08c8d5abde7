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
    #[arg(
        long,
        env = "GPUMEM_INTERVAL",
        default_value = "1s",
        allow_hyphen_values = true
    )]
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

    /// Most HTTP connections served at once; a few of them are kept for /healthz, so a liveness
    /// probe is answered while scrapers take the rest. Default: the open-files limit less
    /// headroom, at most 1024.
    #[arg(long, env = "GPUMEM_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
}

/// More tags than this per device would make `/metrics` large for little insight.
const MAX_TOP_TAGS: usize = 100;
/// More connections than this would not fit a process's descriptors or memory anywhere.
const MAX_CONNECTIONS: usize = 1 << 20;

impl ExporterFlags {
    /// The address and interval, or one line naming the flag that is wrong.
    /// The flags with no setting of their own to return (`--runbook-url`, `--allowed-hosts`,
    /// `--max-connections`) are checked here too, so every serving command refuses them before
    /// it opens anything.
    pub(super) fn validate(&self) -> Result<(SocketAddr, Duration), String> {
        let listen = parse_listen(&self.listen).map_err(|e| format!("--listen: {e}"))?;
        let interval = parse_interval(&self.interval).map_err(|e| format!("--interval: {e}"))?;
        if let Some(url) = &self.runbook_url {
            check_runbook_url(url).map_err(|e| format!("--runbook-url: {e}"))?;
        }
        check_allowed_hosts(&self.allowed_hosts).map_err(|e| format!("--allowed-hosts: {e}"))?;
        self.max_connections()?;
        Ok((listen, interval))
    }

    /// `--max-connections`, checked; `None` for the default (derived from the descriptor limit).
    pub(super) fn max_connections(&self) -> Result<Option<usize>, String> {
        let min = gpumem_observe::web::MIN_CONNECTIONS;
        match self.max_connections {
            Some(n) if !(min..=MAX_CONNECTIONS).contains(&n) => Err(format!(
                "--max-connections: {n} is out of range ({min} to {MAX_CONNECTIONS})"
            )),
            other => Ok(other),
        }
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

/// The runbook's URL ends up in the page's links: only an absolute http(s) URL (a
/// `javascript:` or `data:` one would run in the page's origin when clicked).
fn check_runbook_url(url: &str) -> Result<(), String> {
    let lower = url.trim().to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => {}
        _ => {
            return Err(format!(
                "{:?} is not an http:// or https:// URL",
                url.chars().take(100).collect::<String>()
            ))
        }
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("the URL holds spaces or control characters".to_string());
    }
    Ok(())
}

/// Names given must be names: an empty list item (`--allowed-hosts ''`, `a,,b`) is a mistake
/// that would silently allow nothing more.
fn check_allowed_hosts(names: &[String]) -> Result<(), String> {
    for name in names {
        let name = name.trim();
        if name.is_empty() {
            return Err("an empty name; give host names separated by commas, or * for any".into());
        }
        if name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '/')
        {
            return Err(format!(
                "{:?} is not a host name",
                name.chars().take(100).collect::<String>()
            ));
        }
    }
    Ok(())
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
            max_connections: None,
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
    fn runbook_urls_hosts_and_connection_caps_are_checked() {
        let base = ExporterFlags {
            listen: "127.0.0.1:0".into(),
            interval: "1s".into(),
            allowed_hosts: Vec::new(),
            top_tags: 10,
            runbook_url: None,
            max_connections: None,
        };
        let with_url = |url: &str| ExporterFlags {
            runbook_url: Some(url.to_string()),
            ..base.clone()
        };
        for good in ["https://wiki.example/runbook", "http://10.0.0.1:8080/r.md"] {
            assert!(with_url(good).validate().is_ok(), "{good}");
        }
        for bad in [
            "javascript:alert(1)",
            "JavaScript://%0aalert(1)",
            "data:text/html,x",
            "/runbook",
            "https://",
            "https:///x",
            "https://a b",
        ] {
            let error = with_url(bad).validate().unwrap_err();
            assert!(error.starts_with("--runbook-url:"), "{bad}: {error}");
        }
        let hosts = |names: &[&str]| ExporterFlags {
            allowed_hosts: names.iter().map(|n| n.to_string()).collect(),
            ..base.clone()
        };
        assert!(hosts(&["gpumem.svc", "*"]).validate().is_ok());
        for bad in [&[""][..], &["a", " "], &["a b"]] {
            let error = hosts(bad).validate().unwrap_err();
            assert!(error.starts_with("--allowed-hosts:"), "{bad:?}: {error}");
        }
        let cap = |n: usize| ExporterFlags {
            max_connections: Some(n),
            ..base.clone()
        };
        assert_eq!(cap(64).max_connections(), Ok(Some(64)));
        assert!(cap(1)
            .validate()
            .unwrap_err()
            .starts_with("--max-connections:"));
        assert_eq!(base.max_connections(), Ok(None));
    }
}
