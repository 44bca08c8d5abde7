//! The dashboard by pod, end to end on a node agent: a real Prometheus scrapes `gpumem serve` as
//! the chart runs it on a GPU node (its ServiceMonitor's scrape settings, `service_monitor`),
//! with NVML's readings from a fixture file, fixture `/proc` trees of three pods' processes and
//! one outside any pod, the stand-in API server naming the pods, and one engine publishing its
//! snapshot, merged onto its process. The node's story: vLLM's KV cache grows until the GPU is
//! critical and an allocation is refused, then vLLM's container is OOM-killed and restarts.
//! Every panel and variable of `grafana/dashboard.json` has data for the pod picked, the
//! namespace and pod variables list the fixture's pods, and the restart shows in *Exited
//! processes*; docs/kubernetes.md's scrape check quotes what the agent serves. `pictures`
//! replays the same story slower for that page's pictures. Skipped without prometheus, unless
//! CI=true.

use super::dashboard;
use super::engine::Engine;
use super::panels::{self, Values};
use super::prometheus::{ever, Prometheus};
use super::rules::rules_with_short_for;
use super::service_monitor::scrape_job;
use crate::sidecar::node_agent::agent::{
    self, copy_fixture, fixture_pod, nvml, restart_container, AGENT_POD, GIB, NODE, VLLM_FIXTURE,
};
use crate::sidecar::node_agent::apiserver::ApiServer;
use crate::sidecar::TempDir;
use crate::support::Running;
use crate::web::{eventually, tool_available};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The whole test, start to finish (it takes about 20 s).
const BUDGET: Duration = Duration::from_secs(60);
/// What the dashboard's `$__rate_interval` becomes: Grafana's floor of four scrape intervals.
pub(super) const RATE_INTERVAL: &str = "4s";
/// The pod picked at the top of the dashboard.
pub(super) const PICKED: (&str, &str) = ("serving", "vllm-0");
/// Host pids of the fixture processes: vLLM, an embedder and Triton in pods, and a process
/// outside any pod (`cgroups::TABLE`); vLLM after its restart.
const VLLM: u32 = 4121;
const EMBED: u32 = 4124;
const TRITON: u32 = 4132;
const HOST: u32 = 4140;
const VLLM_AGAIN: u32 = 4200;
const NEW_VLLM_ID: &str = "00000000000000000000000000000000000000000000000000000000000b007e";
/// The pods the API server lists: (namespace, pod, container, fixture).
const PODS: [(&str, &str, &str, &str); 3] = [
    ("serving", "vllm-0", "inference", VLLM_FIXTURE),
    ("serving", "embed-0", "embedder", "v2-systemd-docker"),
    ("ml", "triton-0", "server", "v1-cgroupfs-crio"),
];
/// What the other processes hold all along.
const OTHERS: [(u32, u64); 3] = [(EMBED, 6 * GIB), (TRITON, 4 * GIB), (HOST, 2 * GIB)];
/// What vLLM's process holds beyond its pools (its CUDA context and libraries).
const CONTEXT: u64 = 2 * GIB;

/// One GPU node: its pods, the agent, the publishing engine, and Prometheus scraping the agent.
pub(super) struct Node {
    pub prometheus: Prometheus,
    pub agent: Running,
    engine: Option<Engine>,
    api: ApiServer,
    nvml_file: PathBuf,
    proc_root: TempDir,
    _collect: TempDir,
    _files: TempDir,
}

impl Node {
    /// Starts the node with vLLM holding `vllm` bytes and publishing into `collect`, and
    /// Prometheus scraping it.
    pub(super) fn start(vllm: u64, collect: TempDir) -> Node {
        let proc_root = TempDir::new("board-proc");
        for (.., fixture) in PODS {
            copy_fixture(fixture, proc_root.path());
        }
        copy_fixture("not-a-pod-gpu-host", proc_root.path());
        let files = TempDir::new("board-files");
        let nvml_file = files.join("nvml.json");
        let api = ApiServer::start(NODE);
        api.set_pods(
            PODS.iter()
                .map(|(ns, pod, container, fixture)| fixture_pod(ns, pod, fixture, container))
                .collect(),
        );
        let engine = Engine::start(collect.path().to_path_buf(), vllm - CONTEXT);
        gpu_holds(&nvml_file, VLLM, vllm);
        let log = std::fs::File::create(files.join("agent.log")).expect("log file");
        let agent = agent::start(&api, &proc_root, &collect, &nvml_file, log);
        let prometheus = Prometheus::start_job(
            &rules_with_short_for("1s"),
            scrape_job(agent.addr, AGENT_POD, NODE),
        );
        Node {
            prometheus,
            agent,
            engine: Some(engine),
            api,
            nvml_file,
            proc_root,
            _collect: collect,
            _files: files,
        }
    }

    /// vLLM's process holds `bytes` on the GPU (its pools all but its context).
    pub(super) fn vllm_holds(&self, bytes: u64) {
        gpu_holds(&self.nvml_file, VLLM, bytes);
        if let Some(engine) = &self.engine {
            engine.hold(bytes - CONTEXT);
        }
    }

    /// vLLM cannot grow further: an allocation is refused as out of memory.
    pub(super) fn vllm_refuses(&self) {
        self.engine.as_ref().expect("vLLM runs").refuse();
    }

    /// vLLM's container is OOM-killed and restarts; the new process holds `bytes` (loading).
    pub(super) fn restart_vllm(&mut self, bytes: u64) {
        if let Some(engine) = self.engine.take() {
            engine.kill();
        }
        let (ns, pod, container, fixture) = PODS[0];
        let restarted = restart_container(
            self.proc_root.path(),
            fixture,
            VLLM_AGAIN,
            NEW_VLLM_ID,
            (ns, pod, container),
        );
        let mut pods: Vec<serde_json::Value> = PODS[1..]
            .iter()
            .map(|(ns, pod, container, fixture)| fixture_pod(ns, pod, fixture, container))
            .collect();
        pods.insert(0, restarted);
        self.api.set_pods(pods);
        self.restarted_vllm_holds(bytes);
    }

    /// The restarted vLLM process holds `bytes`.
    pub(super) fn restarted_vllm_holds(&self, bytes: u64) {
        gpu_holds(&self.nvml_file, VLLM_AGAIN, bytes);
    }

    /// Waits up to `limit` for `promql` to have a value for which `holds` is true.
    pub(super) fn until(&self, limit: Duration, promql: &str, holds: impl Fn(f64) -> bool) -> bool {
        eventually(limit, || self.prometheus.value(promql).is_some_and(&holds))
    }
}

/// NVML lists vLLM's process `pid` holding `bytes`, beside the others.
fn gpu_holds(nvml_file: &Path, pid: u32, bytes: u64) {
    let mut processes = vec![(pid, bytes)];
    processes.extend(OTHERS);
    nvml(nvml_file, &processes);
}

/// The variables filled in for the pod picked, as Grafana would.
pub(super) fn picked_values() -> [(&'static str, &'static str); 5] {
    [
        ("instance", NODE),
        ("gpu", "0"),
        ("namespace", PICKED.0),
        ("pod", PICKED.1),
        ("__rate_interval", RATE_INTERVAL),
    ]
}

/// What each of `queries` returns that does not belong to the pod picked (a per-pod query must
/// return only its series; a device-wide one, series without a pod).
fn foreign_series(node: &Node, queries: &[(dashboard::PanelQuery, String)]) -> Vec<String> {
    let mut foreign = Vec::new();
    for (query, promql) in queries {
        for series in node.prometheus.query(promql).unwrap_or_default() {
            let metric = &series["metric"];
            let pod = (metric["namespace"].as_str(), metric["pod"].as_str());
            if pod != (None, None) && pod != (Some(PICKED.0), Some(PICKED.1)) {
                foreign.push(format!("{}: {metric}", query.panel));
            }
        }
    }
    foreign
}

#[test]
fn every_panel_of_the_dashboard_has_data_for_a_pod_on_a_node_agent() {
    if !tool_available("prometheus") {
        return;
    }
    let started = Instant::now();
    let left = || BUDGET.saturating_sub(started.elapsed());
    let mut node = Node::start(40 * GIB, TempDir::new("board-collect"));
    let board = dashboard::load();
    let values: &Values = &picked_values();

    // Five scrapes give every rate() over $__rate_interval its two samples.
    let scraped = node.until(left(), "count_over_time(up{job=\"gpumem\"}[1m])", |n| {
        n >= 5.0
    });
    assert!(
        scraped,
        "Prometheus did not scrape the agent:\n{}",
        node.prometheus.log()
    );
    let vllm = "gpumem_process_used_bytes{namespace=\"serving\",pod=\"vllm-0\",container=\"inference\",process=\"vllm-engine\"}";
    assert!(
        node.until(left(), vllm, |b| b == (40 * GIB) as f64),
        "vLLM's process never reached Prometheus with its pod"
    );
    // The walk-through's scrape check shows these lines: they are what the agent serves now.
    let served = crate::web::get(node.agent.addr, "/metrics").body;
    let walk_through = super::read_repo_file("docs/kubernetes.md");
    let shown: Vec<&str> = walk_through
        .lines()
        .filter(|l| l.starts_with("gpumem_process_used_bytes{"))
        .collect();
    assert_eq!(shown.len(), 4, "docs/kubernetes.md's scrape check");
    for line in shown {
        assert!(
            served.lines().any(|l| l == line),
            "the agent serves no {line}"
        );
    }
    // As the ServiceMonitor scrapes: the node's name is the instance, and the agent's own pod
    // does not label the series that belong to no pod (the device's, a process outside pods).
    let device = node
        .prometheus
        .query("gpumem_device_memory_used_bytes")
        .expect("device series");
    assert_eq!(device.len(), 1, "{device:?}");
    assert_eq!(device[0]["metric"]["instance"], NODE);
    assert_eq!(device[0]["metric"]["node"], NODE);
    assert!(device[0]["metric"]["pod"].is_null(), "{device:?}");
    let host = format!("gpumem_process_used_bytes{{pid=\"{HOST}\",pod=\"\"}}");
    assert_eq!(node.prometheus.value(&host), Some((2 * GIB) as f64));

    // The variables list the node, its GPU, the pods' namespaces, and the pods of the one picked.
    let listed = |name: &str, with: &Values| {
        panels::variable_values(&node.prometheus, &board, name, with)
            .unwrap_or_else(|e| panic!("variable {name}: {e}"))
    };
    assert_eq!(listed("instance", values), [NODE]);
    assert_eq!(listed("gpu", values), ["0"]);
    assert_eq!(listed("namespace", values), ["ml", "serving"]);
    assert_eq!(listed("pod", values), ["embed-0", "vllm-0"]);
    let all_namespaces = [("instance", NODE), ("namespace", ".*")];
    assert_eq!(
        listed("pod", &all_namespaces),
        ["embed-0", "triton-0", "vllm-0"]
    );
    for (name, listed) in panels::all_variable_values(&node.prometheus, &board, values) {
        assert!(
            listed.is_ok_and(|v| !v.is_empty()),
            "variable {name} lists nothing"
        );
    }

    // vLLM's KV cache grows: the GPU goes critical and an allocation is refused.
    node.vllm_holds(63 * GIB);
    node.vllm_refuses();
    let critical = node.until(left(), "gpumem_pressure_level{gpu=\"0\"}", |l| l >= 3.0);
    assert!(critical, "the GPU never went critical");

    // Every panel has data for the pod picked, and only its series or the device's.
    let limit = left().min(Duration::from_secs(15));
    let (asked, empty) =
        panels::queries_without_data(&node.prometheus, &board, values, limit, |_| false);
    assert!(asked >= 25, "only {asked} queries");
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );
    let foreign = foreign_series(&node, &panels::filled_queries(&board, values));
    assert!(
        foreign.is_empty(),
        "series of other pods:\n{}",
        foreign.join("\n")
    );
    // Both annotations mark what happened: the refusal and the critical pressure.
    for annotation in dashboard::annotation_queries(&board) {
        let promql = dashboard::substitute(&annotation.expr, values).expect("filled in");
        let marked = eventually(left().min(Duration::from_secs(10)), || {
            node.prometheus
                .query(&ever(&promql))
                .is_ok_and(|r| !r.is_empty())
        });
        assert!(marked, "{}: no mark: {promql}", annotation.panel);
    }
    // The refusal's pressure fires the critical alert for that GPU, by the node's name.
    let fired = eventually(left(), || {
        node.prometheus.firing("GpumemPressureCritical", Some("0"))
    });
    assert!(fired, "GpumemPressureCritical never fired");

    // vLLM's container is OOM-killed and restarts: *Exited processes* counts it twice, as a
    // publisher that stopped and as a GPU process that vanished holding memory.
    node.restart_vllm(GIB);
    let exited: Vec<String> = panels::filled_queries(&board, values)
        .into_iter()
        .filter(|(q, _)| q.panel == "Exited processes")
        .map(|(_, promql)| promql)
        .collect();
    let counted = || -> f64 {
        exited
            .iter()
            .filter_map(|promql| node.prometheus.value(promql))
            .sum()
    };
    let both = eventually(left(), || counted() == 2.0);
    assert!(
        both,
        "Exited processes counts {} of 2: {exited:?}",
        counted()
    );
    // The pod is still on the board: its new container's process holds the GPU now.
    let again = format!("gpumem_process_used_bytes{{pod=\"vllm-0\",pid=\"{VLLM_AGAIN}\"}}");
    assert!(
        node.until(left(), &again, |b| b == GIB as f64),
        "the new vLLM is not named"
    );
    for rule in node.prometheus.rules() {
        assert_eq!(
            rule["health"], "ok",
            "{}: {}",
            rule["name"], rule["lastError"]
        );
    }
    eprintln!(
        "node agent dashboard test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
