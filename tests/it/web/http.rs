//! Helpers the web and demo tests share: a minimal HTTP client, reading the metrics text,
//! polling with a deadline, and finding external tools (promtool, chromium, prometheus).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One HTTP response.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// A minimal HTTP/1.1 client: one request per connection, bounded by timeouts. A POST says it
/// comes from a script (`X-Gpumem-Request`), as the status page's own requests do.
pub(crate) fn request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Reply> {
    let script = if method == "POST" {
        "X-Gpumem-Request: 1\r\n"
    } else {
        ""
    };
    request_raw(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{script}"),
    )
}

/// Sends `head` (request line and headers, each ending in CRLF) and reads the reply.
pub(crate) fn request_raw(addr: SocketAddr, head: &str) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "{head}Connection: close\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v == "chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

pub(crate) fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path).unwrap_or_else(|e| panic!("GET {path} failed: {e}"))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// `name{labels} value` lines of a metrics text, as (name, labels, value).
pub(super) fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            Some((name.to_string(), labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The value of the first series of `name` whose labels contain `label`.
pub(crate) fn value_of(text: &str, name: &str, label: &str) -> Option<f64> {
    samples(text)
        .into_iter()
        .find(|(n, l, _)| n == name && l.contains(label))
        .map(|(_, _, v)| v)
}

/// Whether a command exists; when it does not and `CI=true`, the test fails instead of skipping.
pub(crate) fn tool_available(tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{tool} is required when CI=true (install it, see .ci/)"
        );
        eprintln!("skipped: {tool} is not installed");
    }
    found
}

/// Polls `check` every 50 ms for up to `limit`; true once it holds.
pub(crate) fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
