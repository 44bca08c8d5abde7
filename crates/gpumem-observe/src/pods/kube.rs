//! The node agent's client of the Kubernetes API server: one request,
//! `GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`, over HTTPS (rustls with ring's
//! primitives; the cluster's CA is the only root trusted), with the ServiceAccount's bearer
//! token. In a pod the address comes from `KUBERNETES_SERVICE_HOST`/`_PORT` and the token and
//! CA from the ServiceAccount's mounted files; tests point it elsewhere.
//!
//! It runs on the pod directory's own thread, never on the sampling path; every request is
//! bounded in time and in the size of its answer.

use super::body::Chunks;
use super::credentials::{load_roots, read_token};
pub use super::credentials::{FileStamp, MAX_CA_BYTES, MAX_TOKEN_BYTES};
use super::podlist::PodList;
use http_body_util::Empty;
use hyper::body::Bytes;
use rustls::pki_types::ServerName;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where a pod's ServiceAccount is mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The longest one request may take, connection and TLS included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest pod list read: 110 pods of a few tens of KiB each is a few MiB.
pub const MAX_LIST_BYTES: usize = 64 << 20;

/// How to reach the API server.
#[derive(Clone)]
pub struct KubeSettings {
    /// The host as the certificate must name it, and the port.
    pub host: String,
    pub port: u16,
    /// The CA certificates that may sign the API server's certificate.
    pub roots: Arc<rustls::RootCertStore>,
    /// Where they were read from, and which version of that file: read again when it changes
    /// (`None` for roots given otherwise).
    pub ca_file: Option<(PathBuf, FileStamp)>,
    /// Read again before every request: projected tokens are rotated by the kubelet.
    pub token_file: PathBuf,
    /// The node whose pods are listed (`spec.nodeName`).
    pub node: String,
}

impl std::fmt::Debug for KubeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSettings")
            .field("url", &self.url())
            .field("token_file", &self.token_file)
            .field("node", &self.node)
            .finish()
    }
}

/// Where the settings come from; `None` fields fall back to the in-cluster defaults.
#[derive(Clone, Debug, Default)]
pub struct KubeConfig {
    /// `https://host:port`; default `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`.
    pub url: Option<String>,
    /// PEM file of the CA; default the ServiceAccount's `ca.crt`.
    pub ca_file: Option<PathBuf>,
    /// The bearer token's file; default the ServiceAccount's `token`.
    pub token_file: Option<PathBuf>,
    pub node: Option<String>,
}

impl KubeConfig {
    /// Checks everything that can be checked before the first request; each error is one
    /// sentence naming what was wrong.
    pub fn settings(&self) -> Result<KubeSettings, String> {
        let node = self
            .node
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or("the node's name is needed to list its pods: set GPUMEM_NODE_NAME (the downward API's spec.nodeName)")?;
        if node.len() > 253
            || !node
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
        {
            return Err(format!("GPUMEM_NODE_NAME {node:?} is not a node name"));
        }
        let url = match &self.url {
            Some(url) => url.clone(),
            None => in_cluster_url()?,
        };
        let (host, port) = parse_url(&url)?;
        let service_account = Path::new(SERVICE_ACCOUNT_DIR);
        let ca_file = self
            .ca_file
            .clone()
            .unwrap_or_else(|| service_account.join("ca.crt"));
        let token_file = self
            .token_file
            .clone()
            .unwrap_or_else(|| service_account.join("token"));
        let (roots, stamp) = load_roots(&ca_file)?;
        read_token(&token_file)?;
        Ok(KubeSettings {
            host,
            port,
            roots: Arc::new(roots),
            ca_file: Some((ca_file, stamp)),
            token_file,
            node: node.to_string(),
        })
    }
}

impl KubeSettings {
    /// Reads the CA file again when it changed since it was read (the kubelet rotates the
    /// ServiceAccount's `ca.crt` by swapping a link), under the rules of the first read. On
    /// an error the roots read before are kept for the next try, and the error is the
    /// request's.
    pub fn refresh_roots(&mut self) -> Result<(), String> {
        let Some((path, stamp)) = &self.ca_file else {
            return Ok(());
        };
        if FileStamp::of(path).as_ref() == Some(stamp) {
            return Ok(());
        }
        let (roots, stamp) = load_roots(path)?;
        let path = path.clone();
        tracing::info!(
            "pods: read the CA file {} again (it changed)",
            path.display()
        );
        self.roots = Arc::new(roots);
        self.ca_file = Some((path, stamp));
        Ok(())
    }

    pub fn url(&self) -> String {
        if self.host.contains(':') {
            format!("https://[{}]:{}", self.host, self.port)
        } else {
            format!("https://{}:{}", self.host, self.port)
        }
    }

    /// The request's path and query: this node's pods only, as the kubelet asks for them.
    pub fn path(&self) -> String {
        format!(
            "/api/v1/pods?fieldSelector={}",
            percent_encode(&format!("spec.nodeName={}", self.node))
        )
    }
}

/// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, as every in-cluster client.
fn in_cluster_url() -> Result<String, String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST")
        .ok()
        .filter(|h| !h.is_empty());
    let Some(host) = host else {
        return Err("KUBERNETES_SERVICE_HOST is not set: not in a pod (point GPUMEM_KUBERNETES_URL at the API server instead)".to_string());
    };
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".to_string());
    if host.contains(':') {
        Ok(format!("https://[{host}]:{port}"))
    } else {
        Ok(format!("https://{host}:{port}"))
    }
}

/// `https://host[:port][/]` → host and port; nothing else is accepted.
fn parse_url(url: &str) -> Result<(String, u16), String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("the API server's URL {url:?} must start with https://"))?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "the API server's URL {url:?} must be https://HOST[:PORT], without a path"
        ));
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("the API server's URL {url:?} has an unclosed '['"))?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("the API server's URL {url:?} has a bad port"))?,
        None => 443,
    };
    ServerName::try_from(host.to_string())
        .map_err(|_| format!("the API server's URL {url:?} has a bad host"))?;
    Ok((host.to_string(), port))
}

/// Percent-encodes a query value (RFC 3986 unreserved characters stay).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Lists the node's pods: one HTTPS request, bounded by [`REQUEST_TIMEOUT`].
pub async fn list_pods(settings: &KubeSettings) -> Result<PodList, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request(settings)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer from {} within {}s",
            settings.url(),
            REQUEST_TIMEOUT.as_secs()
        )),
    }
}

async fn request(settings: &KubeSettings) -> Result<PodList, String> {
    let token = read_token(&settings.token_file)?;
    let url = settings.url();
    let tcp = tokio::net::TcpStream::connect((settings.host.as_str(), settings.port))
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(Arc::clone(&settings.roots))
        .with_no_client_auth();
    let name = ServerName::try_from(settings.host.clone())
        .map_err(|_| format!("{} is not a host name", settings.host))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            format!(
                "TLS with {url} failed: {}",
                without_debug_text(&e.to_string())
            )
        })?;
    let io = hyper_util::rt::TokioIo::new(tls);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP with {url} failed: {e}"))?;
    // The connection is driven beside the request, and dropped with it.
    let driver = tokio::spawn(connection);
    let authority = if settings.host.contains(':') {
        format!("[{}]:{}", settings.host, settings.port)
    } else {
        format!("{}:{}", settings.host, settings.port)
    };
    let request = hyper::Request::get(settings.path())
        .header(hyper::header::HOST, authority)
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::ACCEPT, "application/json")
        .header(
            hyper::header::USER_AGENT,
            concat!("gpumem/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("could not build the request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("GET {url}/api/v1/pods failed: {e}"))?;
    let status = response.status();
    let cap = list_cap();
    let body = Chunks::read(response.into_body(), cap)
        .await
        .map_err(|e| format!("reading the pod list from {url}: {e}"))?;
    driver.abort();
    let Some(body) = body else {
        return Err(format!(
            "the pod list from {url} is larger than {}, the most this agent reads within its \
             memory limit (cgroup {}); keeping the last good list",
            gpumem::units::Bytes(cap as u64),
            memory_limit().map_or("unlimited".to_string(), |l| gpumem::units::Bytes(l)
                .to_string())
        ));
    };
    if !status.is_success() {
        return Err(format!(
            "GET {url}/api/v1/pods answered {status}{}",
            status_message(body)
        ));
    }
    let list: PodList = serde_json::from_reader(body.reader())
        .map_err(|e| format!("the pod list from {url} is not a PodList: {e}"))?;
    if list.kind.as_deref().is_some_and(|k| k != "PodList") {
        let kind = list.kind.as_deref().unwrap_or_default();
        return Err(format!(
            "{url} answered a {}, not a PodList",
            gpumem_wire::process::clean_text(kind, 64)
        ));
    }
    Ok(list)
}

/// The most bytes of pod list read: an eighth of the container's memory limit (a list costs its
/// bytes once while read, and the pods kept are capped at `podlist::MAX_PODS` whatever their
/// number), between 2 MiB and [`MAX_LIST_BYTES`] / 2; 16 MiB where no limit is set.
pub fn list_cap() -> usize {
    const UNLIMITED: usize = 16 << 20;
    match memory_limit() {
        Some(limit) => usize::try_from(limit / 8)
            .unwrap_or(usize::MAX)
            .clamp(2 << 20, MAX_LIST_BYTES / 2),
        None => UNLIMITED,
    }
}

/// This process's cgroup memory limit (v2 `memory.max`, else v1 `memory.limit_in_bytes`);
/// `None` where none is set or it cannot be read.
fn memory_limit() -> Option<u64> {
    let read = |path: &str| {
        let file = gpumem::safe_fs::open_named_regular(Path::new(path)).ok()?;
        let bytes = gpumem::safe_fs::read_capped(file, 64).ok()?.ok()?;
        String::from_utf8(bytes).ok()?.trim().parse::<u64>().ok()
    };
    // v1 reports "no limit" as a huge number.
    read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .filter(|limit| *limit < 1 << 60)
}

/// rustls reports some certificate errors through their `Debug` form
/// (`invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))`): the wrappers go and the
/// innermost name is spelt as words (`invalid peer certificate: CA used as end entity`).
fn without_debug_text(message: &str) -> String {
    let (head, mut rest) = match message.rsplit_once(": ") {
        Some((head, rest)) => (Some(head), rest),
        None => (None, message),
    };
    let is_name = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric());
    let mut unwrapped = false;
    while let Some((name, inner)) = rest.split_once('(') {
        match inner.strip_suffix(')') {
            Some(inner) if is_name(name) => {
                rest = inner;
                unwrapped = true;
            }
            _ => break,
        }
    }
    // A bare `UnknownIssuer` is a variant's name too; `HTTP` or `reset` are words already.
    let camel = rest.starts_with(|c: char| c.is_ascii_uppercase())
        && rest.contains(|c: char| c.is_ascii_lowercase());
    if !is_name(rest) || !(unwrapped || camel) {
        return message.to_string();
    }
    let mut words = String::new();
    for (i, c) in rest.char_indices() {
        if c.is_ascii_uppercase() && i > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_lowercase());
    }
    let words = words.replacen("ca ", "CA ", 1);
    match head {
        Some(head) => format!("{head}: {words}"),
        None => words,
    }
}

/// `: <message>` of a `Status` object the API server answers errors with, when it is one.
fn status_message(body: Chunks) -> String {
    #[derive(serde::Deserialize)]
    struct Status {
        message: Option<String>,
    }
    serde_json::from_reader::<_, Status>(body.reader())
        .ok()
        .and_then(|s| s.message)
        .map(|m| format!(": {}", gpumem_wire::process::clean_text(&m, 300)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_https_host_and_port_only() {
        assert_eq!(
            parse_url("https://10.96.0.1:443"),
            Ok(("10.96.0.1".into(), 443))
        );
        assert_eq!(
            parse_url("https://kubernetes.default.svc/"),
            Ok(("kubernetes.default.svc".into(), 443))
        );
        assert_eq!(
            parse_url("https://[fd00::1]:6443"),
            Ok(("fd00::1".into(), 6443))
        );
        for bad in [
            "http://10.0.0.1",
            "https://",
            "https://host:0",
            "https://host:99999",
            "https://host/api",
            "https://user@host",
            "https://[fd00::1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_shown_to_people_carry_no_debug_text() {
        assert_eq!(
            without_debug_text("invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))"),
            "invalid peer certificate: CA used as end entity"
        );
        assert_eq!(
            without_debug_text("invalid peer certificate: UnknownIssuer"),
            "invalid peer certificate: unknown issuer"
        );
        assert_eq!(without_debug_text("answered HTTP"), "answered HTTP");
        assert_eq!(without_debug_text("connection reset"), "connection reset");
    }

    #[test]
    fn the_field_selector_is_encoded() {
        let settings = KubeSettings {
            host: "fd00::1".into(),
            port: 6443,
            roots: Arc::new(rustls::RootCertStore::empty()),
            ca_file: None,
            token_file: PathBuf::new(),
            node: "gpu-node-1.example".into(),
        };
        assert_eq!(
            settings.path(),
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-1.example"
        );
        assert_eq!(settings.url(), "https://[fd00::1]:6443");
    }

    #[test]
    fn bad_configuration_is_one_sentence() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = dir.path().join("ca.crt");
        let token = dir.path().join("token");
        std::fs::write(&ca, "not a certificate").expect("write");
        std::fs::write(&token, "  \n").expect("write");
        let config = |node: Option<&str>| KubeConfig {
            url: Some("https://127.0.0.1:6443".into()),
            ca_file: Some(ca.clone()),
            token_file: Some(token.clone()),
            node: node.map(String::from),
        };
        let missing_node = config(None).settings().expect_err("no node");
        assert!(missing_node.contains("GPUMEM_NODE_NAME"), "{missing_node}");
        let bad_node = config(Some("a/b")).settings().expect_err("bad node");
        assert!(bad_node.contains("not a node name"), "{bad_node}");
        let no_cert = config(Some("n")).settings().expect_err("no certificate");
        assert!(no_cert.contains("holds no certificate"), "{no_cert}");
        let ca_cert = rcgen::generate_simple_self_signed(vec!["ca.test".to_string()])
            .expect("a self-signed certificate");
        std::fs::write(&ca, ca_cert.cert.pem()).expect("write");
        let empty_token = config(Some("n")).settings().expect_err("empty token");
        assert!(
            empty_token.contains("empty or not a token"),
            "{empty_token}"
        );
        std::fs::write(&token, "abc.def\n").expect("write");
        let settings = config(Some("n")).settings().expect("valid");
        assert_eq!(settings.url(), "https://127.0.0.1:6443");
    }
}
