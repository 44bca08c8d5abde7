//! The exporter's listen address and sampling interval as people write them: parsing (shared by
//! every serving command and the healthcheck, so all accept and reject the same input), the
//! default address, and where a client reaches an address that was bound.

use crate::sampler::MIN_INTERVAL;
use std::net::SocketAddr;
use std::time::Duration;

/// Where the exporter listens unless told otherwise: as a flag's default, and as an address
/// (a test holds the two to the same value).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9400";
pub const DEFAULT_LISTEN_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9400);

/// An IP address and port such as `127.0.0.1:9400` or `[::1]:9400`, or a host name and port
/// (`localhost:9400`), resolved once here: its first IPv4 address, else its first address.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let trimmed = text.trim();
    if let Ok(addr) = trimmed.parse() {
        return Ok(addr);
    }
    let usage = || {
        format!(
            "'{text}' is not an address with a port, such as 127.0.0.1:9400, 0.0.0.0:9400 or \
             localhost:9400"
        )
    };
    let (host, port) = trimmed.rsplit_once(':').ok_or_else(usage)?;
    let is_name = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    let port: u16 = port.parse().map_err(|_| usage())?;
    if !is_name {
        return Err(usage());
    }
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("'{text}': cannot resolve the host name '{host}': {e}"))?
        .collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("'{text}': the host name '{host}' has no address"))
}

/// Where a client reaches a server listening on `addr`: an unspecified address (0.0.0.0, ::)
/// is reached on loopback of the same family; anything else as it is.
pub fn reachable_addr(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    addr
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

use gpumem::units::{format_duration, parse_duration};

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
        assert!(parse_duration("-1s").unwrap_err().contains("is negative"));
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
    fn the_default_address_is_one_address() {
        assert_eq!(parse_listen(DEFAULT_LISTEN), Ok(DEFAULT_LISTEN_ADDR));
    }

    #[test]
    fn host_names_are_resolved_or_say_why_not() {
        let local = parse_listen("localhost:9410").expect("localhost resolves");
        assert!(local.ip().is_loopback() && local.port() == 9410, "{local}");
        let unknown = parse_listen("no-such-host.invalid:9400").expect_err("does not resolve");
        assert!(
            unknown.contains("cannot resolve the host name"),
            "{unknown}"
        );
        for bad in [
            "localhost",
            "localhost:x",
            ":9400",
            "a b:9400",
            "localhost:99999",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_print_as_flags_take_them() {
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(1)), "1s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
    }
}
