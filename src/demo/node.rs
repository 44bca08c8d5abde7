//! The `alerts` scenario's simulated GPU node: the processes that share the simulated device
//! with the demo, in Kubernetes pods, shown to a real node agent (`collect::Collector`, as
//! `gpumem serve` runs it) served beside the demo. The agent reads them as it reads a node:
//! NVML's device and process list (from a file standing in for NVML, written from the
//! simulated device every second), a `/proc` tree of those processes (their cgroups name the
//! pods), a fixed pod list standing in for the API server's, and the demo's own published
//! snapshots from the publish directory, joined onto its process. On the timeline's cue the
//! agent goes away and comes back, its NVML fails, and the trainer's container restarts.

use super::scenario;
use gpumem::manager::MemoryManager;
use gpumem::units::GIB;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the node agent's view needs from the workload thread: what others hold per device.
#[derive(Debug)]
pub(super) struct NodeView {
    others: Vec<AtomicU64>,
}

impl NodeView {
    pub(super) fn new(devices: usize) -> Self {
        NodeView {
            others: (0..devices).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn set_others(&self, device: usize, bytes: u64) {
        if let Some(others) = self.others.get(device) {
            others.store(bytes, Relaxed);
        }
    }

    pub(super) fn others(&self, device: usize) -> u64 {
        self.others.get(device).map_or(0, |o| o.load(Relaxed))
    }
}

/// At least this much of the device is the demo's neighbours' at any time (their CUDA contexts
/// and weights), so the processes panel shows them even at low pressure.
pub(super) const NEIGHBOURS_FLOOR: u64 = 3 * GIB;

/// The node's name, as the agent's pod list and series call it.
pub(super) const NODE_NAME: &str = "demo-node";

/// A process sharing the device: its pod, its share of what "others" hold, its cgroup.
struct Neighbour {
    pid: u32,
    command: &'static str,
    /// Parts in 100 of what others hold.
    share: u64,
    /// `(namespace, pod, uid, container, container ID)`; `None` for a process outside pods.
    pod: Option<(
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    )>,
}

const EMBED: Neighbour = Neighbour {
    pid: 4124,
    command: "python3",
    share: 25,
    pod: Some((
        "serving",
        "embed-0",
        "3c1d6f0a-5b7e-4c2d-9e8f-0a1b2c3d4e5f",
        "embedder",
        "5e3a0c9b1d7f4e2a8c6b0d9f1e3a5c7b9d0f2e4a6c8b0d1f3e5a7c9b1d3f5e7a",
    )),
};
const TRAINER: Neighbour = Neighbour {
    pid: 4131,
    command: "torchrun",
    share: 60,
    pod: Some((
        "batch",
        "trainer-0",
        "8f2e4d6c-1a3b-4c5d-8e7f-9a0b1c2d3e4f",
        "trainer",
        "7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e1b3d5f7a9c",
    )),
};
/// The trainer after its container restarted: a new process under a new container ID.
const TRAINER_AGAIN: Neighbour = Neighbour {
    pid: 4231,
    pod: Some((
        "batch",
        "trainer-0",
        "8f2e4d6c-1a3b-4c5d-8e7f-9a0b1c2d3e4f",
        "trainer",
        "2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f4a6c8e0b2d4f6a8c0e2b4d",
    )),
    ..TRAINER
};
const HOST: Neighbour = Neighbour {
    pid: 4140,
    command: "tritonserver",
    share: 15,
    pod: None,
};
/// The demo's own process, in the pod that serves the model.
const DEMO_POD: (&str, &str, &str, &str, &str) = (
    "serving",
    "llm-0",
    "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
    "engine",
    "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
);

/// The cgroup v2 path the kubelet's systemd driver and containerd give a Burstable pod's
/// container, as the agent reads it from `/proc/<pid>/cgroup`.
fn pod_cgroup(uid: &str, container_id: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container_id}.scope\n",
        uid.replace('-', "_")
    )
}

/// The files the agent reads: `<dir>/proc`, `<dir>/nvml.json`, and the pods.
pub(super) struct SimNode {
    dir: PathBuf,
    own_pid: u32,
    trainer_restarted: bool,
}

impl SimNode {
    /// Lays out the node's `/proc` under a new directory in `parent`.
    pub(super) fn create(parent: &Path) -> std::io::Result<SimNode> {
        let dir = parent.join(format!("gpumem-demo-node-{}", std::process::id()));
        let node = SimNode {
            own_pid: std::process::id(),
            dir,
            trainer_restarted: false,
        };
        std::fs::create_dir_all(node.proc_root())?;
        for neighbour in [EMBED, TRAINER, HOST] {
            node.add_process(&neighbour)?;
        }
        let own = node.proc_root().join(node.own_pid.to_string());
        std::fs::create_dir_all(own.join("ns"))?;
        let (_, _, uid, _, id) = DEMO_POD;
        std::fs::write(own.join("cgroup"), pod_cgroup(uid, id))?;
        std::fs::write(
            own.join("status"),
            format!("Name:\tgpumem\nNStgid:\t{}\n", node.own_pid),
        )?;
        // Joins the process to what it publishes: the same pid in the same PID namespace.
        if let Some(namespace) = gpumem_wire::process::current_pid_namespace() {
            std::os::unix::fs::symlink(namespace, own.join("ns").join("pid"))?;
        }
        Ok(node)
    }

    pub(super) fn proc_root(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// Where the demo publishes for the agent when `--publish-dir` does not say.
    pub(super) fn publish_dir(&self) -> PathBuf {
        self.dir.join("publish")
    }

    pub(super) fn nvml_file(&self) -> PathBuf {
        self.dir.join("nvml.json")
    }

    fn add_process(&self, neighbour: &Neighbour) -> std::io::Result<()> {
        let dir = self.proc_root().join(neighbour.pid.to_string());
        std::fs::create_dir_all(&dir)?;
        let cgroup = match neighbour.pod {
            Some((_, _, uid, _, id)) => pod_cgroup(uid, id),
            None => "0::/system.slice/tritonserver.service\n".to_string(),
        };
        std::fs::write(dir.join("cgroup"), cgroup)?;
        std::fs::write(dir.join("comm"), format!("{}\n", neighbour.command))
    }

    fn neighbours(&self) -> [Neighbour; 3] {
        let trainer = if self.trainer_restarted {
            TRAINER_AGAIN
        } else {
            TRAINER
        };
        [EMBED, trainer, HOST]
    }

    /// The pod list the API server would give for this node, with the trainer's container
    /// both as it runs first and as it runs after its restart (the kubelet reports the old
    /// run's ID as its last state).
    pub(super) fn pods() -> gpumem_observe::pods::PodTable {
        let pod = |(namespace, name, uid, container, id): (&str, &str, &str, &str, &str),
                   last: Option<&str>| {
            let mut status =
                serde_json::json!({"name": container, "containerID": format!("containerd://{id}")});
            if let Some(last) = last {
                status["lastState"] = serde_json::json!({"terminated": {"containerID": format!("containerd://{last}")}});
            }
            serde_json::json!({"metadata": {"name": name, "namespace": namespace, "uid": uid},
                "status": {"containerStatuses": [status]}})
        };
        let trainer_first = TRAINER.pod.map(|p| p.4);
        let items: Vec<serde_json::Value> = [
            pod(DEMO_POD, None),
            pod(EMBED.pod.expect("in a pod"), None),
            pod(TRAINER_AGAIN.pod.expect("in a pod"), trainer_first),
        ]
        .into();
        let list = serde_json::json!({"kind": "PodList", "items": items});
        match serde_json::from_value(list) {
            Ok(list) => gpumem_observe::pods::PodTable::from_list(list),
            Err(error) => {
                tracing::warn!(%error, "alerts scenario: no pod list; processes go unnamed");
                gpumem_observe::pods::PodTable::default()
            }
        }
    }

    /// Writes what NVML would say now (or that it fails), and restarts the trainer when the
    /// timeline says so.
    pub(super) fn update(
        &mut self,
        manager: &MemoryManager,
        view: &NodeView,
        moment: scenario::Moment,
    ) -> std::io::Result<()> {
        if moment.trainer_restarted != self.trainer_restarted {
            self.restart_trainer(moment.trainer_restarted)?;
        }
        let fixture = match moment.nvml_fails {
            true => {
                serde_json::json!({"devices": [], "error": "NVML_ERROR_UNKNOWN: the alerts scenario's simulated NVML failure"})
            }
            false => self.nvml_reading(manager, view),
        };
        let tmp = self.nvml_file().with_extension("tmp");
        std::fs::write(&tmp, fixture.to_string())?;
        std::fs::rename(&tmp, self.nvml_file())
    }

    fn restart_trainer(&mut self, restarted: bool) -> std::io::Result<()> {
        let (gone, new) = match restarted {
            true => (TRAINER, TRAINER_AGAIN),
            false => (TRAINER_AGAIN, TRAINER), // A new cycle: the story starts over.
        };
        let _ = std::fs::remove_dir_all(self.proc_root().join(gone.pid.to_string()));
        self.add_process(&new)?;
        self.trainer_restarted = restarted;
        tracing::info!(
            "alerts scenario: the trainer's container restarted (pid {} -> {})",
            gone.pid,
            new.pid
        );
        Ok(())
    }

    fn nvml_reading(&self, manager: &MemoryManager, view: &NodeView) -> serde_json::Value {
        let backend = manager.backend();
        let devices: Vec<serde_json::Value> = manager
            .device_indices()
            .into_iter()
            .filter_map(|device| {
                let properties = backend.properties(device).ok()?;
                let ours = manager
                    .device_stats(device)
                    .map_or(0, |s| s.counters.reserved_bytes);
                let others = view.others(device);
                let mut processes = vec![
                    serde_json::json!({"pid": self.own_pid, "used_bytes": ours, "name": "gpumem"}),
                ];
                for neighbour in self.neighbours() {
                    processes.push(serde_json::json!({"pid": neighbour.pid,
                        "used_bytes": others / 100 * neighbour.share, "name": neighbour.command}));
                }
                Some(
                    serde_json::json!({"name": properties.name, "uuid": properties.uuid,
                    "total_bytes": properties.total_memory_bytes,
                    "used_bytes": (ours + others).min(properties.total_memory_bytes),
                    "processes": processes}),
                )
            })
            .collect();
        serde_json::json!({ "devices": devices })
    }

    /// Removes the node's files (the demo is stopping).
    pub(super) fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
