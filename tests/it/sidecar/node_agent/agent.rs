//! A node agent as the tests run it, shared by its own end-to-end test (`serve`) and the
//! dashboard's (`e2e::node_agent`): `gpumem serve` with NVML's readings from a fixture file,
//! fixture `/proc` trees copied into one proc root, the stand-in API server naming the pods of
//! those fixtures, a vLLM engine's published snapshot, and a container restart as a node shows
//! one (the old pid gone, a new one under a new container ID, the pod's last state terminated).

use super::apiserver::{pod, ApiServer};
use super::cgroups::{fixtures, TABLE};
use crate::sidecar::{now, serve_logging_to, TempDir};
use crate::support::Running;
use std::path::Path;
use std::process::Stdio;

pub(crate) const GIB: u64 = 1 << 30;
/// The one GPU of the fixture node.
pub(crate) const UUID: &str = "GPU-5157a000-0000-4000-8000-000000000001";
/// The node the agent runs on, as the downward API names it.
pub(crate) const NODE: &str = "gpu-node-1";
/// The agent's own pod (namespace, name), as the chart's DaemonSet would name one.
pub(crate) const AGENT_POD: (&str, &str) = ("gpumem", "gpumem-x7k2p");
/// The fixture whose process publishes: vLLM, pid 1 of its own PID namespace (the fixture has
/// the `status` and `ns/pid` link that join it to its file).
pub(crate) const VLLM_FIXTURE: &str = "v2-systemd-containerd";

/// A fixture's process as `cgroups::TABLE` says it is: host pid, pod UID, and its container's
/// ID as the pod's status spells it (`containerd://<id>`). Panics for a fixture outside pods.
pub(crate) fn identity(fixture: &str) -> (u32, &'static str, String) {
    let (_, pid, expected, _) = TABLE
        .iter()
        .find(|(name, ..)| *name == fixture)
        .unwrap_or_else(|| panic!("no fixture {fixture}"));
    let Ok(Some((uid, id, runtime))) = expected else {
        panic!("{fixture} is not a pod's process");
    };
    // The cgroupfs driver does not say which runtime wrote the path: any will do there.
    (
        *pid,
        uid,
        format!("{}://{id}", runtime.unwrap_or("containerd")),
    )
}

/// The pod `namespace/name` whose container `container` runs the process of `fixture`.
pub(crate) fn fixture_pod(
    namespace: &str,
    name: &str,
    fixture: &str,
    container: &str,
) -> serde_json::Value {
    let (_, uid, id) = identity(fixture);
    pod(namespace, name, uid, &[(container, &id)])
}

/// Copies fixture `name`'s process into `root` (links included).
pub(crate) fn copy_fixture(name: &str, root: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", fixtures().join(name).display()))
        .arg(root)
        .status()
        .expect("cp runs");
    assert!(status.success());
}

/// What NVML would say: one 80 GiB device and these (host pid, bytes) processes, plus 1 GiB
/// that no process listed holds. Replaced atomically: the agent reads it at every sample.
pub(crate) fn nvml(path: &Path, processes: &[(u32, u64)]) {
    let used: u64 = processes.iter().map(|(_, b)| b).sum::<u64>() + GIB;
    let list: Vec<serde_json::Value> = processes
        .iter()
        .map(|(pid, bytes)| serde_json::json!({"pid": pid, "used_bytes": bytes}))
        .collect();
    let fixture = serde_json::json!({"devices": [{
        "name": "NVIDIA H100 80GB HBM3", "uuid": UUID,
        "total_bytes": 80 * GIB, "used_bytes": used, "processes": list}]});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, fixture.to_string()).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Publishes vLLM's snapshot with `device` (the publish format's device object, on GPU 0 of
/// [`UUID`]) as its one device: itself as pid 1 of the fixture's PID namespace, publishing
/// every `interval_seconds`.
pub(crate) fn publish(dir: &Path, interval_seconds: f64, mut device: serde_json::Value) {
    device["gpu"] = 0.into();
    device["uuid"] = UUID.into();
    let file = serde_json::json!({
        "format": "gpumem.publish", "version": 1, "pid": 1, "process": "vllm-engine",
        "pid_namespace": "pid:[4026532601]", "timestamp_seconds": now(),
        "interval_seconds": interval_seconds, "writer": "test", "devices": [device]});
    let path = dir.join("gpumem-1.json");
    gpumem::safe_fs::write_atomically(&path, file.to_string().as_bytes(), &Default::default())
        .expect("publish");
}

/// `gpumem serve` as the chart runs it on `NODE`, with NVML from `nvml_file`, the host's `/proc`
/// from `proc_root`, pods from `api` (asked again only when a process's pod is new: the
/// refresh is an hour away), snapshots from `collect`, sampling every 200 ms.
pub(crate) fn start(
    api: &ApiServer,
    proc_root: &TempDir,
    collect: &TempDir,
    nvml_file: &Path,
    stderr: impl Into<Stdio>,
) -> Running {
    let kubernetes = api.agent_args("1h");
    let mut args = vec![
        "--test-nvml-fixture",
        nvml_file.to_str().expect("utf-8"),
        "--proc-root",
        proc_root.str(),
    ];
    args.extend(kubernetes.iter().map(String::as_str));
    args.extend(["--pod-name", AGENT_POD.1, "--pod-namespace", AGENT_POD.0]);
    serve_logging_to(collect, &args, stderr)
}

/// The container of `fixture`'s process restarts: a new process `new_pid` (named `python3`)
/// runs in the same pod under container ID `new_id` (hex), the old process is gone, and the pod
/// `namespace/name` now lists the new ID with the old one as its last, OOM-killed state. Give
/// the returned pod to the API server; NVML's list is the caller's to change.
pub(crate) fn restart_container(
    proc_root: &Path,
    fixture: &str,
    new_pid: u32,
    new_id: &str,
    (namespace, name, container): (&str, &str, &str),
) -> serde_json::Value {
    let (old_pid, uid, old_id) = identity(fixture);
    let (runtime, old_hex) = old_id.split_once("://").expect("runtime://id");
    // A process's /proc directory appears and vanishes whole: each is made or taken apart
    // under a name that is no pid, and renamed, so the agent never reads half of one (a
    // cgroup file gone before the name would read as a process outside any pod).
    let old_dir = proc_root.join(old_pid.to_string());
    let old_cgroup = std::fs::read_to_string(old_dir.join("cgroup")).expect("read");
    let making = proc_root.join(format!(".new-{new_pid}"));
    std::fs::create_dir_all(&making).expect("mkdir");
    std::fs::write(making.join("cgroup"), old_cgroup.replace(old_hex, new_id)).expect("write");
    std::fs::write(making.join("comm"), "python3\n").expect("write");
    std::fs::rename(&making, proc_root.join(new_pid.to_string())).expect("the new process");
    let mut restarted = pod(
        namespace,
        name,
        uid,
        &[(container, &format!("{runtime}://{new_id}"))],
    );
    restarted["status"]["containerStatuses"][0]["restartCount"] = 1.into();
    restarted["status"]["containerStatuses"][0]["lastState"] = serde_json::json!(
        {"terminated": {"exitCode": 137, "reason": "OOMKilled", "containerID": old_id}});
    let gone = proc_root.join(format!(".gone-{old_pid}"));
    std::fs::rename(&old_dir, &gone).expect("the old process exits");
    std::fs::remove_dir_all(gone).expect("remove");
    restarted
}
