//! A stand-in for the Kubernetes API server that speaks its protocol for the one request the
//! node agent makes: HTTPS with a certificate signed by a CA made here (as a cluster's is),
//! `GET /api/v1/pods?fieldSelector=spec.nodeName%3D<node>` with the ServiceAccount's bearer
//! token, answered with a `PodList` sent in chunks (as the API server streams lists), or with a
//! `Status` object and 401/403 when the token or the request is not what a narrow role allows.
//! The pod list can be changed while it runs, and it can be told to refuse everything.

use parking_lot::Mutex;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The token the stand-in accepts.
pub(crate) const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.test-service-account.signature";

/// What the test can change and read.
#[derive(Default)]
pub(crate) struct Shared {
    /// The `items` of the PodList, as JSON objects.
    pub pods: Mutex<Vec<serde_json::Value>>,
    /// Answer 403 to everything.
    pub refuse: AtomicBool,
    pub requests: AtomicU64,
    /// Requests refused for a wrong token, path or selector (the agent should make none).
    pub rejected: AtomicU64,
    pub last_rejection: Mutex<String>,
    /// When set, the body of every 200 instead of a list of `pods` (a list too large to build
    /// as JSON values, say).
    pub raw_list: Mutex<Option<Arc<String>>>,
}

pub(crate) struct ApiServer {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    /// The CA's certificate (PEM) and the token, as files the agent is pointed at.
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
    /// The node whose pods it lists.
    node: String,
    _dir: super::super::TempDir,
}

impl ApiServer {
    /// Starts it on a free loopback port, for `node`'s pods.
    pub(crate) fn start(node: &str) -> ApiServer {
        let dir = super::super::TempDir::new("apiserver");
        let (ca_pem, chain, key) = certificates();
        let ca_file = dir.join("ca.crt");
        let token_file = dir.join("token");
        std::fs::write(&ca_file, ca_pem).expect("write the CA");
        std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write the token");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the server's certificate");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let shared = Arc::new(Shared::default());
        let state = Arc::clone(&shared);
        let expected = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let config = Arc::clone(&config);
                let state = Arc::clone(&state);
                let expected = expected.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let Ok(connection) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let tls = rustls::StreamOwned::new(connection, stream);
                    let _ = serve_one(tls, &state, &expected);
                });
            }
        });
        ApiServer {
            addr,
            shared,
            ca_file,
            token_file,
            node: node.to_string(),
            _dir: dir,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The arguments that point `gpumem serve` at this server for its node's pods, as the
    /// chart's node agent is, listing them again every `pod_refresh`.
    pub(crate) fn agent_args(&self, pod_refresh: &str) -> Vec<String> {
        let path = |file: &PathBuf| file.to_str().expect("utf-8").to_string();
        vec![
            "--pod-source".to_string(),
            "kubernetes".to_string(),
            "--node-name".to_string(),
            self.node.clone(),
            "--kubernetes-url".to_string(),
            self.url(),
            "--kubernetes-ca".to_string(),
            path(&self.ca_file),
            "--kubernetes-token-file".to_string(),
            path(&self.token_file),
            "--pod-refresh".to_string(),
            pod_refresh.to_string(),
        ]
    }

    pub(crate) fn set_pods(&self, pods: Vec<serde_json::Value>) {
        *self.shared.pods.lock() = pods;
    }

    pub(crate) fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

/// A CA, and a server certificate for 127.0.0.1 signed by it.
fn certificates() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kubernetes-ca (test)");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA");
    let mut server_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "kubernetes".to_string()])
            .expect("server params");
    server_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver (test)");
    server_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = rcgen::KeyPair::generate().expect("server key");
    let server = server_params
        .signed_by(&server_key, &ca)
        .expect("server certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    (ca.pem(), vec![server.der().clone()], key)
}

/// Reads one request and answers it; the connection closes after.
fn serve_one(mut tls: impl Read + Write, state: &Shared, expected: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(&mut tls);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut authorization = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("authorization") {
                authorization = value.trim().to_string();
            }
        }
    }
    drop(reader);
    state.requests.fetch_add(1, Ordering::SeqCst);
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let reject = |code: u16, reason: &str, message: String| {
        state.rejected.fetch_add(1, Ordering::SeqCst);
        *state.last_rejection.lock() = message.clone();
        (
            code,
            reason.to_string(),
            status_object(code, reason, &message),
        )
    };
    let (code, reason, body) = if authorization != format!("Bearer {TOKEN}") {
        reject(401, "Unauthorized", "Unauthorized".to_string())
    } else if method != "GET" || target != expected {
        reject(
            403,
            "Forbidden",
            format!("{method} {target}: only this node's pods may be listed"),
        )
    } else if state.refuse.load(Ordering::SeqCst) {
        (
            403,
            "Forbidden".to_string(),
            status_object(
                403,
                "Forbidden",
                "pods is forbidden: User \"system:serviceaccount:gpumem:gpumem\" cannot list resource \"pods\" in API group \"\" at the cluster scope",
            ),
        )
    } else if let Some(raw) = state.raw_list.lock().clone() {
        (200, "OK".to_string(), raw.to_string())
    } else {
        let list = serde_json::json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "4242"},
            "items": *state.pods.lock(),
        });
        (200, "OK".to_string(), list.to_string())
    };
    // The list in chunks, as the API server sends it; errors with a length.
    if code == 200 {
        write!(
            tls,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )?;
        // Large lists in large chunks: the test's time goes to the agent, not to framing.
        let size = if body.len() > 1 << 20 { 64 << 10 } else { 700 };
        for chunk in body.as_bytes().chunks(size) {
            write!(tls, "{:x}\r\n", chunk.len())?;
            tls.write_all(chunk)?;
            tls.write_all(b"\r\n")?;
        }
        tls.write_all(b"0\r\n\r\n")?;
    } else {
        write!(
            tls,
            "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
    }
    tls.flush()
}

/// The API server's error object (`kind: Status`).
fn status_object(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
    .to_string()
}

/// A pod as the API server lists it: metadata, the node, and each container's status.
pub(crate) fn pod(
    namespace: &str,
    name: &str,
    uid: &str,
    containers: &[(&str, &str)],
) -> serde_json::Value {
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|(container, id)| {
            serde_json::json!({
                "name": container,
                "ready": true,
                "restartCount": 0,
                "image": "registry.example/engine:1",
                "containerID": id,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            })
        })
        .collect();
    serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "labels": {"app": name}},
        "spec": {"nodeName": "gpu-node-1",
                 "containers": containers.iter().map(|(c, _)| serde_json::json!({"name": c})).collect::<Vec<_>>()},
        "status": {"phase": "Running", "containerStatuses": statuses},
    })
}
