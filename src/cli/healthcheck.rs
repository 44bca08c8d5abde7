//! `gpumem healthcheck`: GETs a URL (by default `/healthz` of the local exporter) and exits 0 on
//! a 2xx answer, 1 otherwise. For container HEALTHCHECKs in images without curl or wget.
//! `--timeout` bounds the whole check — name resolution, connecting, sending and every read —
//! so a server that trickles its answer cannot keep a probe running past it.

use super::CliError;
use clap::Args;
use gpumem::units::parse_duration;
use gpumem_observe::exporter::{parse_listen, reachable_addr, DEFAULT_LISTEN};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Enough for a status line, headers and a health message.
const MAX_REPLY: u64 = 64 * 1024;

#[derive(Args, Debug)]
pub(super) struct HealthcheckArgs {
    /// The URL to GET (http only). Default: /healthz on GPUMEM_LISTEN, else on 127.0.0.1:9400
    /// (an unspecified address such as 0.0.0.0 is checked on loopback).
    #[arg(long, env = "GPUMEM_HEALTHCHECK_URL")]
    url: Option<String>,

    /// Give up after this long (e.g. 2s, 500ms).
    #[arg(
        long,
        env = "GPUMEM_HEALTHCHECK_TIMEOUT",
        default_value = "3s",
        allow_hyphen_values = true
    )]
    timeout: String,
}

pub(super) fn run(args: HealthcheckArgs) -> Result<(), CliError> {
    let timeout =
        parse_duration(&args.timeout).map_err(|e| CliError::usage(format!("--timeout: {e}")))?;
    if timeout.is_zero() {
        return Err(CliError::usage("--timeout: must be more than 0 (e.g. 2s)"));
    }
    let url = match args.url {
        Some(url) => url,
        None => default_url()?,
    };
    let target = parse_url(&url).map_err(|e| CliError::usage(format!("--url: {e}")))?;
    let (status, body) =
        get(&target, timeout).map_err(|e| CliError::runtime(format!("{url}: {e}")))?;
    let said = body.lines().next().unwrap_or("").trim();
    if (200..300).contains(&status) {
        println!("{url}: {status} {said}");
        Ok(())
    } else {
        Err(CliError::runtime(format!("{url}: {status} {said}")))
    }
}

/// `/healthz` on the address the exporter listens on (GPUMEM_LISTEN), on loopback.
fn default_url() -> Result<String, CliError> {
    let listen = std::env::var("GPUMEM_LISTEN").unwrap_or_else(|_| DEFAULT_LISTEN.to_string());
    let addr = parse_listen(&listen).map_err(|e| CliError::usage(format!("GPUMEM_LISTEN: {e}")))?;
    Ok(format!("http://{}/healthz", reachable_addr(addr)))
}

/// Where to connect and what to ask for.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    /// `host:port`, for connecting and the Host header.
    authority: String,
    path: String,
}

fn parse_url(url: &str) -> Result<Target, String> {
    // The URL goes into the request line and the Host header as it is: a space, CR or LF would
    // split it into another request.
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{:?} holds a space or a control character (encode it, e.g. %20)",
            url.chars().take(200).collect::<String>()
        ));
    }
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("'{url}' is not an http:// URL"))?;
    // A fragment is the client's own: it is never sent (RFC 9110, 4.2.4).
    let rest = rest.split('#').next().unwrap_or(rest);
    let (authority, path) = match rest.find(['/', '?']) {
        Some(0) => ("", rest),
        Some(at) if rest.as_bytes()[at] == b'?' => (&rest[..at], &rest[at..]),
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    // `http://host?x` asks for `/?x`.
    let path = match path.starts_with('?') {
        true => format!("/{path}"),
        false => path.to_string(),
    };
    if authority.is_empty() {
        return Err(format!("'{url}' has no host"));
    }
    // A port is there unless the authority ends in a bracketed IPv6 address or has no colon.
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| !port.contains(']'));
    let authority = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok(Target { authority, path })
}

fn get(target: &Target, timeout: Duration) -> Result<(u16, String), String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut stream = connect_any(target, left)?;
    stream
        .set_write_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: gpumem-healthcheck\r\nConnection: close\r\n\r\n",
        target.path, target.authority
    )
    .map_err(|e| e.to_string())?;
    // Each read may wait only for what is left of the whole check: a read timeout alone is
    // per read, and a byte every so often would renew it for ever.
    let late = || format!("no complete answer within {timeout:?}");
    let mut reply = Vec::new();
    let mut buffer = [0u8; 4096];
    while (reply.len() as u64) < MAX_REPLY {
        if Instant::now() >= deadline {
            return Err(late());
        }
        stream
            .set_read_timeout(Some(left()))
            .map_err(|e| e.to_string())?;
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(late())
            }
            Err(e) => return Err(format!("{}: {e}", late())),
        }
    }
    parse_reply(&String::from_utf8_lossy(&reply))
}

/// Connects to the first of the authority's addresses that answers: `localhost` resolves to
/// `::1` and `127.0.0.1`, and a server may listen on only one of them.
fn connect_any(target: &Target, left: impl Fn() -> Duration) -> Result<TcpStream, String> {
    let addrs = resolve(&target.authority, left())?;
    let mut failures = Vec::new();
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, left()) {
            Ok(stream) => return Ok(stream),
            Err(e) => failures.push(format!("{addr}: {e}")),
        }
    }
    if failures.is_empty() {
        Err(format!("{} resolves to nothing", target.authority))
    } else {
        Err(failures.join("; "))
    }
}

/// The addresses `authority` names, waiting at most `limit` for a resolver that may hang (the
/// lookup runs on a thread of its own, left behind if it does not answer in time).
fn resolve(authority: &str, limit: Duration) -> Result<Vec<SocketAddr>, String> {
    // An address needs no resolver.
    if let Ok(addr) = authority.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let (found, wait) = std::sync::mpsc::channel();
    let name = authority.to_string();
    std::thread::Builder::new()
        .name("gpumem-resolve".to_string())
        .spawn(move || {
            let _ = found.send(name.to_socket_addrs().map(Iterator::collect::<Vec<_>>));
        })
        .map_err(|e| format!("cannot resolve {authority}: {e}"))?;
    match wait.recv_timeout(limit) {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(e)) => Err(format!("cannot resolve {authority}: {e}")),
        Err(_) => Err(format!("cannot resolve {authority} within the timeout")),
    }
}

/// The status code and body of an HTTP/1.1 answer, its body de-chunked where it was sent in chunks.
fn parse_reply(text: &str) -> Result<(u16, String), String> {
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| "the answer is not HTTP".to_string())?;
    let chunked = head.lines().skip(1).any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// Joins the chunks of a chunked body (sizes in hex, optional extensions after `;`), stopping
/// at the last chunk or at the first malformed size.
fn dechunk(mut body: &str) -> String {
    let mut joined = String::new();
    while let Some((size_line, rest)) = body.split_once("\r\n") {
        let size = size_line.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size, 16) else {
            break;
        };
        if size == 0 || rest.len() < size || !rest.is_char_boundary(size) {
            break;
        }
        joined.push_str(&rest[..size]);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_into_address_and_path() {
        let t = parse_url("http://127.0.0.1:9400/healthz").expect("valid");
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("127.0.0.1:9400", "/healthz")
        );
        let t = parse_url("http://localhost").expect("valid");
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("localhost:80", "/")
        );
        let t = parse_url("http://[::1]:9400/x").expect("valid");
        assert_eq!(t.authority, "[::1]:9400");
        assert_eq!(
            parse_url("http://[::1]/").expect("valid").authority,
            "[::1]:80"
        );
        // The fragment stays with the client; a query without a path asks for `/`.
        let t = parse_url("http://127.0.0.1:9400/healthz#top").expect("valid");
        assert_eq!(t.path, "/healthz");
        let t = parse_url("http://127.0.0.1:9400#x").expect("valid");
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("127.0.0.1:9400", "/")
        );
        let t = parse_url("http://127.0.0.1:9400?verbose").expect("valid");
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("127.0.0.1:9400", "/?verbose")
        );
        assert!(parse_url("https://x/").is_err());
        assert!(parse_url("http:///healthz").is_err());
        for smuggled in [
            "http://127.0.0.1:9400/healthz HTTP/1.1\r\nX: y",
            "http://127.0.0.1:9400/a\nb",
            "http://127.0.0.1:9400/a b",
            "http://127.0.0.1:9400\r\n/x",
        ] {
            assert!(parse_url(smuggled).is_err(), "{smuggled:?}");
        }
    }

    #[test]
    fn the_timeout_bounds_a_trickled_answer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Answers one byte every 100 ms for 5 s: each read gets a byte well within any read
        // timeout, so only a deadline on the whole check stops early.
        std::thread::spawn(move || {
            if let Ok((mut client, _)) = listener.accept() {
                let mut request = [0u8; 1024];
                let _ = client.read(&mut request);
                for _ in 0..50 {
                    if client.write_all(b"H").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        let target = Target {
            authority: format!("127.0.0.1:{port}"),
            path: "/healthz".to_string(),
        };
        let started = Instant::now();
        let answer = get(&target, Duration::from_millis(500));
        assert!(answer.is_err(), "{answer:?}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "a 500 ms check took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn chunked_answers_are_joined() {
        let reply = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok \r\n8;x=1\r\nsampling\r\n0\r\n\r\n";
        assert_eq!(parse_reply(reply), Ok((200, "ok sampling".to_string())));
        let plain = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nstale";
        assert_eq!(parse_reply(plain), Ok((503, "stale".to_string())));
        assert!(parse_reply("SSH-2.0").is_err());
    }

    #[test]
    fn every_resolved_address_is_tried() {
        // localhost names ::1 and 127.0.0.1 on most hosts; listen on IPv4 only and expect the
        // connection to find it whichever order the resolver gives.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let target = Target {
            authority: format!("localhost:{port}"),
            path: "/".to_string(),
        };
        let stream = connect_any(&target, || Duration::from_secs(2)).expect("connects");
        assert_eq!(stream.peer_addr().expect("peer").port(), port);
    }
}
