//! `gpumem healthcheck`: GETs a URL (by default `/healthz` of the local exporter) and exits 0 on
//! a 2xx answer, 1 otherwise. For container HEALTHCHECKs in images without curl or wget.

use super::CliError;
use crate::exporter::{parse_duration, parse_listen, DEFAULT_LISTEN};
use clap::Args;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Enough for a status line, headers and a health message.
const MAX_REPLY: u64 = 64 * 1024;

#[derive(Args, Debug)]
pub struct HealthcheckArgs {
    /// The URL to GET (http only). Default: /healthz on GPUMEM_LISTEN, else on 127.0.0.1:9400
    /// (an unspecified address such as 0.0.0.0 is checked on loopback).
    #[arg(long, env = "GPUMEM_HEALTHCHECK_URL")]
    url: Option<String>,

    /// Give up after this long (e.g. 2s, 500ms).
    #[arg(long, env = "GPUMEM_HEALTHCHECK_TIMEOUT", default_value = "3s")]
    timeout: String,
}

pub fn run(args: HealthcheckArgs) -> Result<(), CliError> {
    let timeout =
        parse_duration(&args.timeout).map_err(|e| CliError::usage(format!("--timeout: {e}")))?;
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
    let mut addr =
        parse_listen(&listen).map_err(|e| CliError::usage(format!("GPUMEM_LISTEN: {e}")))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            [127, 0, 0, 1].into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    Ok(format!("http://{addr}/healthz"))
}

/// Where to connect and what to ask for.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    /// `host:port`, for connecting and the Host header.
    authority: String,
    path: String,
}

fn parse_url(url: &str) -> Result<Target, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("'{url}' is not an http:// URL"))?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
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
    Ok(Target {
        authority,
        path: path.to_string(),
    })
}

fn get(target: &Target, timeout: Duration) -> Result<(u16, String), String> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<SocketAddr> = target
        .authority
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", target.authority))?
        .collect();
    let addr = addrs
        .first()
        .ok_or_else(|| format!("{} resolves to nothing", target.authority))?;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut stream = TcpStream::connect_timeout(addr, left()).map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: gpumem-healthcheck\r\nConnection: close\r\n\r\n",
        target.path, target.authority
    )
    .map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    stream
        .take(MAX_REPLY)
        .read_to_end(&mut reply)
        .map_err(|e| format!("no complete answer within {timeout:?}: {e}"))?;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| "the answer is not HTTP".to_string())?;
    Ok((status, body.to_string()))
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
        assert!(parse_url("https://x/").is_err());
        assert!(parse_url("http:///healthz").is_err());
    }
}
