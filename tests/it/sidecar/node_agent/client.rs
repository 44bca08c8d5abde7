//! The node agent's API client against the stand-in API server: the request a narrow
//! ServiceAccount may make is answered (chunked, over TLS with the cluster's CA); a wrong token,
//! an untrusted certificate and a refusal are errors that say which — never a panic.

use super::apiserver::{pod, ApiServer};
use gpumem_observe::pods::kube::{list_pods, KubeConfig};
use std::sync::atomic::Ordering;

fn list(config: &KubeConfig) -> Result<usize, String> {
    let settings = config.settings()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime
        .block_on(list_pods(&settings))
        .map(|list| list.items.len())
}

fn config(server: &ApiServer) -> KubeConfig {
    KubeConfig {
        url: Some(server.url()),
        ca_file: Some(server.ca_file.clone()),
        token_file: Some(server.token_file.clone()),
        node: Some("gpu-node-1".to_string()),
    }
}

#[test]
fn the_node_s_pods_are_listed_with_the_token_over_tls() {
    let server = ApiServer::start("gpu-node-1");
    let many: Vec<serde_json::Value> = (0..110)
        .map(|i| {
            pod(
                "serving",
                &format!("engine-{i}"),
                &format!("0a1b2c3d-0000-4000-8000-{i:012}"),
                &[("engine", &format!("containerd://{:064x}", i))],
            )
        })
        .collect();
    server.set_pods(many);
    // 110 pods (the kubelet's default maximum) arrive in many chunks.
    assert_eq!(list(&config(&server)), Ok(110));
    assert_eq!(server.shared.rejected.load(Ordering::SeqCst), 0);

    // Another node's pods are not what the stand-in allows: the selector is checked.
    let other = KubeConfig {
        node: Some("gpu-node-2".to_string()),
        ..config(&server)
    };
    let error = list(&other).expect_err("another node");
    assert!(error.contains("403"), "{error}");
    assert!(error.contains("only this node's pods"), "{error}");

    // A token that is not the ServiceAccount's.
    let dir = super::super::TempDir::new("wrong-token");
    std::fs::write(dir.join("token"), "not-the-token").expect("write");
    let wrong = KubeConfig {
        token_file: Some(dir.join("token")),
        ..config(&server)
    };
    let error = list(&wrong).expect_err("wrong token");
    assert!(error.contains("401"), "{error}");

    // The role taken away: the API server's own message comes through.
    server.shared.refuse.store(true, Ordering::SeqCst);
    let error = list(&config(&server)).expect_err("refused");
    assert!(error.contains("403 Forbidden"), "{error}");
    assert!(error.contains("cannot list resource"), "{error}");
}

#[test]
fn a_server_the_ca_did_not_sign_is_refused() {
    let server = ApiServer::start("gpu-node-1");
    let impostor = ApiServer::start("gpu-node-1");
    let mixed = KubeConfig {
        ca_file: Some(impostor.ca_file.clone()),
        ..config(&server)
    };
    let error = list(&mixed).expect_err("untrusted certificate");
    assert!(error.contains("TLS"), "{error}");
    assert_eq!(
        server.requests(),
        0,
        "no request reaches an untrusted server"
    );
}
