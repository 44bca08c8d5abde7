//! Case 8: the HTTP side answers only requests that name it by an IP address, localhost or an
//! allowed name (DNS rebinding), the demo's state-changing endpoint refuses what a cross-site
//! form can send, and label values carry no bidirectional overrides.

use crate::support::Running;
use crate::web::{request, request_raw};

fn demo(extra: &[&str]) -> Running {
    let mut args = vec![
        "demo",
        "--backend",
        "sim",
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "200ms",
        "--duration",
        "30s",
    ];
    args.extend_from_slice(extra);
    Running::start(&args)
}

#[test]
fn requests_must_name_this_server() {
    let server = demo(&["--allowed-hosts", "gpumem.monitoring.svc"]);
    let addr = server.addr;
    let status = |host: &str| {
        request_raw(
            addr,
            &format!("GET /api/v1/snapshot HTTP/1.1\r\nHost: {host}\r\n"),
        )
        .expect("request")
        .status
    };
    assert_eq!(status(&addr.to_string()), 200);
    assert_eq!(status(&format!("localhost:{}", addr.port())), 200);
    assert_eq!(status("gpumem.monitoring.svc:9400"), 200);
    for rebound in [
        "attacker.example",
        "attacker.example:9400",
        "127.0.0.1.attacker.example",
    ] {
        assert_eq!(status(rebound), 403, "Host: {rebound}");
    }
}

#[test]
fn a_cross_site_form_cannot_start_a_pressure_spike() {
    let server = demo(&[]);
    let addr = server.addr;
    let path = "/api/v1/demo/pressure-spike?seconds=5";
    for content_type in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
    ] {
        let reply = request_raw(
            addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://attacker.example\r\n\
                 Content-Type: {content_type}\r\n"
            ),
        )
        .expect("request");
        assert_eq!(reply.status, 403, "{content_type}");
    }
    let bare =
        request_raw(addr, &format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\n")).expect("request");
    assert_eq!(bare.status, 403, "no header, no JSON");
    assert_eq!(request(addr, "POST", path).expect("request").status, 202);
    let json = request_raw(
        addr,
        &format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"),
    )
    .expect("request");
    assert_eq!(json.status, 202);
}

#[test]
fn label_values_carry_no_bidi_overrides() {
    for name in [
        "evil\u{202E}gnp.exe",
        "a\u{2066}b\u{2069}",
        "zero\u{200B}width",
    ] {
        let cleaned = gpumem::snapshot::process::clean_process_name(name);
        assert!(
            !cleaned.chars().any(|c| matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')),
            "{cleaned:?}"
        );
    }
}
