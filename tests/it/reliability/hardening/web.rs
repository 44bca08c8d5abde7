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
    // No Host at all, and a target naming another host than Host does (issue 48: both 200).
    let bare = request_raw(addr, "GET /api/v1/snapshot HTTP/1.1\r\n").expect("request");
    assert_eq!(bare.status, 400, "no Host");
    let absolute = |target_host: &str| {
        request_raw(
            addr,
            &format!("GET http://{target_host}/api/v1/snapshot HTTP/1.1\r\nHost: {addr}\r\n"),
        )
        .expect("request")
        .status
    };
    assert_eq!(
        absolute("attacker.example"),
        403,
        "absolute-form, another host"
    );
    assert_eq!(
        absolute(&addr.to_string()),
        200,
        "absolute-form, this server"
    );
    // Two Hosts: a proxy in front and this server could each believe another one.
    for second in ["attacker.example", "127.0.0.1"] {
        let twice = request_raw(
            addr,
            &format!("GET /api/v1/snapshot HTTP/1.1\r\nHost: {addr}\r\nHost: {second}\r\n"),
        )
        .expect("request");
        assert_eq!(twice.status, 400, "Host twice, then {second}");
    }
}

/// The status page cannot be framed (clickjacking), sniffed as another type, or run a script
/// that is not its own; the runbook link it carries is an http(s) URL (`javascript:` ones are
/// refused at start, `bad_input::flags`).
#[test]
fn the_page_cannot_be_framed_sniffed_or_scripted() {
    let server = demo(&["--runbook-url", "https://wiki.example/gpumem-runbook"]);
    for path in ["/", "/?x=1"] {
        let page = request(server.addr, "GET", path).expect("the page");
        assert_eq!(page.status, 200);
        assert_eq!(page.header("x-frame-options"), "DENY");
        assert_eq!(page.header("x-content-type-options"), "nosniff");
        let csp = page.header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{directive} not in {csp:?}");
        }
        assert!(!csp.contains("unsafe-eval"), "{csp}");
        assert_eq!(page.header("cache-control"), "no-store");
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
        let cleaned = gpumem_wire::process::clean_process_name(name);
        assert!(
            !cleaned.chars().any(|c| matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')),
            "{cleaned:?}"
        );
    }
}
