//! The node agent end to end: `gpumem serve` with NVML's readings from a test fixture (NVML
//! cannot be faked below the library), the host's `/proc` from fixture trees, and the stand-in
//! API server. Scraped on `/metrics` and read on the page and the API: pods' processes carry
//! `namespace`, `pod` and `container`; others keep their command names; what a process
//! publishes is merged onto it; a pod the list does not know yet is asked for at once; a
//! container that restarts leaves a flight record naming its pod; an API server that refuses
//! costs fresh names, not sampling.

use super::agent::{
    self, copy_fixture, fixture_pod, nvml, restart_container, GIB, UUID, VLLM_FIXTURE,
};
use super::apiserver::ApiServer;
use crate::sidecar::TempDir;
use crate::support::Running;
use crate::web::{eventually, get, value_of};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

const NEW_VLLM_ID: &str = "0000000000000000000000000000000000000000000000000000000000c0ffee";

/// What the vLLM engine publishes, its OOM count at `ooms`.
fn publish(dir: &Path, ooms: u64) {
    let device = serde_json::json!({"reserved_bytes": 28 * GIB, "in_use_bytes": 27 * GIB,
        "ooms_total": ooms, "tags": [{"tag": "kv_cache", "live_bytes": 20 * GIB}],
        "pools": [{"pool": "large", "reserved_bytes": 28 * GIB}]});
    agent::publish(dir, 60.0, device);
}

fn metrics(agent: &Running) -> String {
    get(agent.addr, "/metrics").body
}

fn json(agent: &Running, path: &str) -> serde_json::Value {
    serde_json::from_str(&get(agent.addr, path).body).expect("JSON")
}

#[test]
fn every_gpu_process_is_named_by_its_pod() {
    let proc_root = TempDir::new("agent-proc");
    for fixture in [
        VLLM_FIXTURE,
        "v1-cgroupfs-crio",
        "not-a-pod-gpu-host",
        "unknown-kubepods-shape",
    ] {
        copy_fixture(fixture, proc_root.path());
    }
    let collect = TempDir::new("agent-collect");
    let files = TempDir::new("agent-files");
    let nvml_file = files.join("nvml.json");
    nvml(
        &nvml_file,
        &[
            (4121, 30 * GIB),
            (4132, 4 * GIB),
            (4140, 2 * GIB),
            (4150, GIB),
        ],
    );
    publish(collect.path(), 0);
    let api = ApiServer::start(agent::NODE);
    let vllm_pod = || fixture_pod("serving", "vllm-0", VLLM_FIXTURE, "inference");
    // The list knows vLLM's pod only: Triton's pod is "new" to it.
    api.set_pods(vec![vllm_pod()]);
    let log = files.join("agent.log");
    let agent = agent::start(
        &api,
        &proc_root,
        &collect,
        &nvml_file,
        std::fs::File::create(&log).expect("log file"),
    );
    let vllm = "pid=\"1\",process=\"vllm-engine\",namespace=\"serving\",pod=\"vllm-0\",container=\"inference\"";
    assert!(
        eventually(Duration::from_secs(15), || value_of(
            &metrics(&agent),
            "gpumem_process_used_bytes",
            vllm
        ) == Some((30 * GIB) as f64)),
        "vLLM's process never carried its pod:\n{}",
        metrics(&agent)
    );
    // Triton's pod appears in the list; the agent asks again by itself (the refresh is an
    // hour away) and names it within the 5 s gap.
    api.set_pods(vec![
        vllm_pod(),
        fixture_pod("serving", "triton-0", "v1-cgroupfs-crio", "server"),
    ]);
    let triton = "pid=\"4132\",process=\"python3\",namespace=\"serving\",pod=\"triton-0\",container=\"server\"";
    assert!(
        eventually(Duration::from_secs(15), || value_of(
            &metrics(&agent),
            "gpumem_process_used_bytes",
            triton
        )
        .is_some()),
        "Triton's pod was never asked for:\n{}",
        metrics(&agent)
    );
    let text = metrics(&agent);
    // Outside pods, and in a shape not understood: the command's name, no pod labels.
    for pid in ["4140", "4150"] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("gpumem_process_used_bytes{") && l.contains(&format!("pid=\"{pid}\""))
            })
            .unwrap_or_else(|| panic!("pid {pid} missing:\n{text}"));
        assert!(line.contains("process=\"python3\""), "{line}");
        assert!(!line.contains("pod="), "{line}");
    }
    assert_eq!(
        value_of(
            &text,
            "gpumem_pod_unattributed_processes",
            "reason=\"unrecognised_cgroup\""
        ),
        Some(1.0)
    );
    assert_eq!(value_of(&text, "gpumem_pod_list_up", ""), Some(1.0));
    if crate::web::tool_available("promtool") {
        let (status, said) = crate::support::promtool_check_metrics(&text);
        assert!(
            status.success() && said.trim().is_empty(),
            "promtool: {said}\n{text}"
        );
    }
    // What vLLM publishes is merged onto the same process: same pid, name and pod.
    let merged = format!("process=\"vllm-engine\",pid=\"1\",gpu=\"0\",uuid=\"{UUID}\",namespace=\"serving\",pod=\"vllm-0\",container=\"inference\"");
    assert_eq!(
        value_of(&text, "gpumem_reserved_bytes", &merged),
        Some((28 * GIB) as f64),
        "{text}"
    );
    assert!(value_of(&text, "gpumem_tag_live_bytes", "pod=\"vllm-0\"").is_some());
    // The request rate stayed bounded: the first list, Triton's ask, perhaps one more.
    assert!(api.requests() <= 4, "{} requests", api.requests());
    assert_eq!(api.shared.rejected.load(Ordering::SeqCst), 0);
    let snapshot = json(&agent, "/api/v1/snapshot");
    assert_eq!(snapshot["sidecar"]["this_pod"]["pod"], "gpumem-x7k2p");
    assert_eq!(snapshot["sidecar"]["pods"]["node"], "gpu-node-1");
    let page = get(agent.addr, "/").body;
    for shown in [
        "serving/vllm-0 / inference",
        "gpumem/gpumem-x7k2p",
        "serving/triton-0 / server",
    ] {
        assert!(page.contains(shown), "the page lacks {shown}");
    }

    // An OOM in vLLM: its record names the biggest other holder, by pod.
    publish(collect.path(), 3);
    assert!(
        eventually(Duration::from_secs(10), || {
            json(&agent, "/api/v1/oom")["records"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["trigger"] == "oom"))
        }),
        "no OOM record"
    );
    let records = json(&agent, "/api/v1/oom");
    let oom = records["records"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["trigger"] == "oom"))
        .expect("an OOM record");
    let summary = oom["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains("vllm-engine pid 1, pod serving/vllm-0 / inference")
            && summary.contains("biggest holders: 4.0 GiB held by pid 4132, pod triton-0 / server"),
        "{summary}"
    );
    assert_eq!(oom["recorded_in"]["pod"], "gpumem-x7k2p");

    // vLLM's container restarts: the old process is gone, a new one runs under a new ID.
    let restarted = restart_container(
        proc_root.path(),
        VLLM_FIXTURE,
        4200,
        NEW_VLLM_ID,
        ("serving", "vllm-0", "inference"),
    );
    api.set_pods(vec![restarted]);
    nvml(&nvml_file, &[(4200, GIB), (4132, 4 * GIB), (4140, 2 * GIB)]);
    assert!(
        eventually(Duration::from_secs(15), || {
            json(&agent, "/api/v1/oom")["records"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["trigger"] == "exited"))
        }),
        "no record of the restart"
    );
    let records = json(&agent, "/api/v1/oom");
    let exit = records["records"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["trigger"] == "exited"))
        .expect("an exit record");
    assert_eq!(exit["process"]["pod"]["pod"], "vllm-0");
    assert_eq!(exit["process"]["pod"]["container"], "inference");
    assert_eq!(exit["held_bytes"], 30 * GIB);
    assert!(exit["device"]["memory"]["used_bytes"].as_u64().is_some());
    let summary = exit["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains("pod serving/vllm-0 / inference is gone: its container restarted")
            && summary.contains("holding 30.0 GiB"),
        "{summary}"
    );
    // The old engine's file is still collected, and still that pod's, though NVML no longer
    // lists the process that named it.
    let snapshot = json(&agent, "/api/v1/snapshot");
    let old_engine = snapshot["sidecar"]["processes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["process"] == "vllm-engine"))
        .expect("the old engine's file is still collected");
    assert_eq!(old_engine["pod"]["pod"], "vllm-0", "{old_engine}");
    assert!(
        metrics(&agent)
            .lines()
            .any(|l| l.starts_with("gpumem_pool_reserved_bytes{") && l.contains("pod=\"vllm-0\"")),
        "the old engine's pools lost their pod"
    );
    // The exit's reason comes from the list once it names the new container: either way the
    // process is kept as exited, with its pod, on the page and in the API.
    let snapshot = json(&agent, "/api/v1/snapshot");
    let exited = &snapshot["sidecar"]["exited_gpu"][0];
    assert_eq!(exited["last"]["pod"]["pod"], "vllm-0");
    assert!(get(agent.addr, "/").body.contains("restarted"));
    assert_eq!(
        value_of(&metrics(&agent), "gpumem_exited_gpu_processes", ""),
        Some(1.0)
    );

    // The API server refuses from now on: names are kept, the problem is on /healthz (200).
    api.shared.refuse.store(true, Ordering::SeqCst);
    std::fs::create_dir_all(proc_root.path().join("4300")).expect("mkdir");
    std::fs::write(
        proc_root.path().join("4300/cgroup"),
        "0::/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-00000000abcd/00000000000000000000000000000000000000000000000000000000000000aa\n",
    )
    .expect("write");
    nvml(
        &nvml_file,
        &[(4200, GIB), (4132, 4 * GIB), (4140, 2 * GIB), (4300, GIB)],
    );
    assert!(
        eventually(Duration::from_secs(15), || {
            value_of(&metrics(&agent), "gpumem_pod_list_up", "") == Some(0.0)
        }),
        "the refusal never showed"
    );
    let health = get(agent.addr, "/healthz");
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(health.body.contains("pods: GET"), "{}", health.body);
    assert!(health.body.contains("403 Forbidden"), "{}", health.body);
    assert!(value_of(&metrics(&agent), "gpumem_process_used_bytes", triton).is_some());
    drop(agent);
    // The unknown shape was logged once, however many scans saw it.
    let logged = std::fs::read_to_string(&log).expect("log");
    assert_eq!(
        logged
            .matches("cgroup shape this version does not know")
            .count(),
        1,
        "{logged}"
    );
}

/// Flags, environment, and what stderr must name.
type BadCase<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn bad_node_agent_input_exits_2_with_one_line() {
    let dir = TempDir::new("agent-flags");
    let bad_json = dir.join("nvml.json");
    std::fs::write(&bad_json, "{\"devices\": [{\"uuid\": 7}]}").expect("write");
    let missing = dir.join("missing");
    let cases: Vec<BadCase> = vec![
        (
            vec!["--pod-source", "kubernetes"],
            vec![],
            "GPUMEM_NODE_NAME",
        ),
        (
            vec!["--pod-source", "kubernetes", "--node-name", "n1"],
            vec![("KUBERNETES_SERVICE_HOST", "")],
            "KUBERNETES_SERVICE_HOST is not set",
        ),
        (
            vec![
                "--pod-source",
                "kubernetes",
                "--node-name",
                "n1",
                "--kubernetes-url",
                "https://127.0.0.1:6443",
                "--kubernetes-ca",
                missing.to_str().expect("utf-8"),
            ],
            vec![],
            "cannot read the CA file",
        ),
        (vec!["--pod-source", "sometimes"], vec![], "--pod-source"),
        (
            vec!["--proc-root", missing.to_str().expect("utf-8")],
            vec![],
            "--proc-root",
        ),
        (vec!["--pod-refresh", "0s"], vec![], "--pod-refresh"),
        (
            vec!["--test-nvml-fixture", bad_json.to_str().expect("utf-8")],
            vec![],
            "--test-nvml-fixture",
        ),
        (
            vec![],
            vec![("GPUMEM_POD_NAME", "vllm-0")],
            "GPUMEM_POD_NAMESPACE",
        ),
    ];
    for (args, env, says) in cases {
        let output = crate::support::gpumem(&["serve", "--backend", "sim"])
            .args(&args)
            .envs(env.iter().copied())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?} should say {says}: {stderr}"
        );
        // clap's own parse errors come with a usage hint (as for every flag); ours are one line.
        if !stderr.starts_with("error:") {
            assert!(stderr.starts_with("gpumem: "), "{args:?}: {stderr}");
            assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        }
    }
    // auto without a cluster around: no pods, no complaint.
    let output = crate::support::gpumem(&["serve", "--backend", "sim", "--listen", "nowhere"])
        .env("GPUMEM_NODE_NAME", "n1")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--listen") && !stderr.contains("pods"),
        "{stderr}"
    );
}
