//! Which `Host` a request may name. A page on another site can make a browser resolve its own
//! name to 127.0.0.1 (DNS rebinding) and then read the loopback API as same-origin; the one
//! thing it cannot choose is the `Host` header, which carries its own name. So requests must
//! name this server by an IP address (what `--listen` binds, loopback or a pod IP that
//! Prometheus scrapes), `localhost`, or a name the operator allowed (`--allowed-hosts`).

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;

/// The names allowed besides IP addresses and `localhost`; `*` allows any.
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts(Arc<Vec<String>>);

impl AllowedHosts {
    pub fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Self {
        let names = names
            .into_iter()
            .map(|n| n.as_ref().trim().to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .collect();
        AllowedHosts(Arc::new(names))
    }

    /// Whether a `Host` header value names this server acceptably.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let name = strip_port(&host);
        name.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self
                .0
                .iter()
                .any(|allowed| allowed == "*" || allowed == name)
    }
}

/// `name:port` -> `name`; `[::1]:9400` -> `::1`.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The middleware: 400 for a request with no `Host` or more than one (RFC 9112: a proxy and
/// this server could each pick another one), 403 for a request naming another host in `Host`
/// or in an absolute-form target.
pub(crate) async fn check_host(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    if request
        .headers()
        .get_all(header::HOST)
        .iter()
        .nth(1)
        .is_some()
    {
        return (
            StatusCode::BAD_REQUEST,
            "a request must have one Host header, not several\n",
        )
            .into_response();
    }
    // An absolute-form target (`GET http://name/metrics`) names the host itself, and a
    // proxy in front would route by it: it must be acceptable too, and the same as `Host`.
    let target = request.uri().authority().map(|a| a.as_str().to_string());
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{FFFD}"));
    let Some(host) = host else {
        // RFC 9112, 3.2: a request without Host gets 400 (every HTTP/1.1 client sends one).
        return (
            StatusCode::BAD_REQUEST,
            "a request must have a Host header\n",
        )
            .into_response();
    };
    let named = target.as_deref().unwrap_or(host);
    if !allowed.allows(host) || !allowed.allows(named) {
        let refused = if allowed.allows(host) { named } else { host };
        return (
            StatusCode::FORBIDDEN,
            format!(
                "Host {:?} is not allowed: use an IP address or localhost, or add the name with \
                 --allowed-hosts (GPUMEM_ALLOWED_HOSTS)\n",
                refused.chars().take(100).collect::<String>()
            ),
        )
            .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_localhost_and_allowed_names_pass() {
        let allowed = AllowedHosts::new(["gpumem.monitoring.svc"]);
        for host in [
            "127.0.0.1:9400",
            "[::1]:9400",
            "10.1.2.3",
            "localhost:9400",
            "LOCALHOST",
            "gpumem.monitoring.svc:9400",
        ] {
            assert!(allowed.allows(host), "{host}");
        }
        for host in [
            "evil.example:9400",
            "127.0.0.1.nip.io",
            "localhost.evil.example",
            "",
        ] {
            assert!(!allowed.allows(host), "{host}");
        }
        assert!(AllowedHosts::new(["*"]).allows("anything.example"));
    }
}
