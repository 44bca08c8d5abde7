//! What the collecting process adds to a snapshot — `gpumem serve`, as a sidecar in one pod or as
//! the node agent — how its sources are doing (NVML, the collect directory, the pod list), the
//! processes NVML sees on each GPU, and the snapshots collected from other processes. In-process
//! there is none, and renderers read the empty part instead ([`crate::Snapshot::collected`]).
//! [`ProcessDevice`] and [`ProcessPool`] are also the body of the publish format
//! (`docs/publish-format.md`): every field `f` of a device is exported as `gpumem_f`, every field
//! `f` of a pool as `gpumem_pool_f`, labelled with the process and pid that published it.

use crate::ProcessDevice;
use serde::{Deserialize, Serialize};

/// The collecting process's part of a snapshot (`"sidecar"` in the JSON); `None` in a snapshot
/// of in-process managers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CollectorSnapshot {
    /// Each source in use and whether it works (`gpumem_up{source=...}`).
    pub sources: Vec<SourceStatus>,
    /// Compute processes on the GPUs, as NVML reports them.
    pub gpu_processes: Vec<GpuProcess>,
    /// Processes whose published snapshots are fresh and whose pid is alive.
    pub processes: Vec<CollectedProcess>,
    /// How reading the collect directory went; `None` without `--collect-dir`.
    pub collect: Option<CollectStatus>,
    /// Processes that stopped publishing lately (newest first), with their last snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exited: Vec<ExitedProcess>,
    /// GPU processes NVML listed that vanished while they held memory (newest first): a
    /// process that exited or was killed, or a container that restarted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exited_gpu: Vec<ExitedGpuProcess>,
    /// How naming processes' pods is going (the node agent); `None` without a pod source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodsStatus>,
    /// The pod this gpumem runs in, from the downward API (`GPUMEM_POD_NAMESPACE`,
    /// `GPUMEM_POD_NAME`), when it was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub this_pod: Option<ThisPod>,
}

/// The pod a process runs in, as the node agent found it: the UID and container ID from the
/// process's cgroup, the names from the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    /// The container's name; `None` for a process in the pod's cgroup but no container's, or
    /// a container the pod's status does not list (yet).
    pub container: Option<String>,
    /// `metadata.uid` (for a static pod, the config hash its cgroup is named after).
    pub uid: String,
    /// The container's ID from the cgroup (hex, without the runtime's `containerd://`).
    pub container_id: Option<String>,
}

impl PodRef {
    /// `vllm-0 / inference`, or `vllm-0` without a container name: how people name it.
    pub fn short(&self) -> String {
        match &self.container {
            Some(container) => format!("{} / {container}", self.pod),
            None => self.pod.clone(),
        }
    }
}

/// The pod of this gpumem (a sidecar or the node agent), from the downward API.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThisPod {
    pub namespace: String,
    pub pod: String,
}

/// How the node agent names pods: the pod list it holds and how fetching it goes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodsStatus {
    /// `kubernetes`.
    pub source: String,
    /// The node whose pods are listed.
    pub node: String,
    /// Whether the latest request for the list succeeded.
    pub up: bool,
    /// Why the latest request failed (the last good list is still used).
    pub reason: Option<String>,
    /// Pods in the list held now; `None` before the first list arrived.
    pub pods_known: Option<u64>,
    /// How old the list held now is, in seconds.
    pub list_age_seconds: Option<f64>,
    /// Requests for the list, and those that failed, since the start.
    pub requests_total: u64,
    pub errors_total: u64,
    /// GPU processes in a pod the list does not name (yet): a refresh has been asked for.
    pub unnamed_processes: u64,
    /// GPU processes under `kubepods` in a cgroup shape this version does not know (named by
    /// their command instead); the first such shape is logged once.
    pub unrecognised_cgroups: u64,
    /// GPU processes left without pod labels because more pods than the cap hold GPU memory.
    #[serde(default)]
    pub over_cap: u64,
}

/// A GPU process that vanished while it held memory, kept for `--exited-retention`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitedGpuProcess {
    /// How NVML listed it last (its pod, what it used).
    pub last: GpuProcess,
    /// When the node agent noticed, in seconds since the Unix epoch.
    pub exited_at_seconds: f64,
    /// `exited` (the process is gone), or `restarted` (its container runs again under another
    /// container ID).
    pub reason: String,
}

/// A collected process that dropped out, kept for `--exited-retention` (15 min by default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitedProcess {
    /// Its last collected snapshot (peaks, OOM count, pools, tags).
    pub last: CollectedProcess,
    /// When the collector noticed, in seconds since the Unix epoch.
    pub exited_at_seconds: f64,
    /// `exited` (its pid is gone), `stale` (it stopped publishing), `stopped` (it removed its
    /// file, as a clean shutdown does).
    pub reason: String,
    /// Whether the collector removed the file it left behind.
    pub file_removed: bool,
}

impl CollectorSnapshot {
    /// Nothing collected: what an in-process snapshot answers (see [`crate::Snapshot::collected`]).
    pub const EMPTY: CollectorSnapshot = CollectorSnapshot {
        sources: Vec::new(),
        gpu_processes: Vec::new(),
        processes: Vec::new(),
        collect: None,
        exited: Vec::new(),
        exited_gpu: Vec::new(),
        pods: None,
        this_pod: None,
    };

    /// Each collected process's record of `device` (joined on the UUID, else the index).
    pub fn on_device<'a>(
        &'a self,
        device: &'a super::DeviceSnapshot,
    ) -> impl Iterator<Item = (&'a CollectedProcess, &'a ProcessDevice)> + 'a {
        self.processes.iter().flat_map(move |process| {
            process
                .devices
                .iter()
                .filter(move |d| d.is(device))
                .map(move |d| (process, d))
        })
    }

    /// The sources that do not work, as `source: reason` lines (for `/healthz` and the page),
    /// after a first line saying so when no source reads the device, and with the pod list's
    /// problem (names kept from the last good list) last.
    pub fn degraded(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.blind().into_iter().collect();
        lines.extend(
            self.sources
                .iter()
                .filter(|s| !s.up)
                .map(|s| format!("{}: {}", s.source, s.reason.as_deref().unwrap_or("down"))),
        );
        if let Some(pods) = self.pods.as_ref().filter(|p| !p.up) {
            lines.push(format!(
                "pods: {}",
                pods.reason
                    .as_deref()
                    .unwrap_or("the pod list is not available")
            ));
        }
        lines
    }

    /// Set while no source reads device memory (NVML, or the backend given instead): the
    /// collector is blind to the device, sees only what processes publish, and says so.
    pub fn blind(&self) -> Option<String> {
        let devices: Vec<&SourceStatus> = self
            .sources
            .iter()
            .filter(|s| DEVICE_SOURCES.contains(&s.source.as_str()))
            .collect();
        if devices.is_empty() || devices.iter().any(|s| s.up) {
            return None;
        }
        let names: Vec<&str> = devices.iter().map(|s| s.source.as_str()).collect();
        Some(format!(
            "blind to the device: no {} reading, so device memory and processes that do not \
             publish are not seen; pressure comes from the snapshots processes publish",
            names.join(" or ")
        ))
    }

    /// Notes about sources that work but not fully (the collect budget), as `source: note`.
    pub fn notes(&self) -> Vec<String> {
        let over_budget = self.collect.as_ref().and_then(|c| c.over_budget.as_ref());
        over_budget
            .map(|note| format!("collect: {note}"))
            .into_iter()
            .collect()
    }
}

/// The sources that read device memory.
const DEVICE_SOURCES: [&str; 3] = ["nvml", "cuda", "sim"];

/// One source of the collector's data: `nvml`, `cuda`, `sim` (device memory) or `collect`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    pub source: String,
    pub up: bool,
    /// Why it is down (or a note while up, such as a fallback in use).
    pub reason: Option<String>,
}

/// A process with a compute context on a GPU, from NVML.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// NVML's device index (not necessarily the CUDA index; join on `uuid`).
    pub gpu: usize,
    pub uuid: String,
    /// The pid as this collector's PID namespace sees it when it could be mapped, else NVML's.
    pub pid: u32,
    /// The pid NVML reported (the host's PID namespace).
    pub nvml_pid: u32,
    /// Whether `pid` was found among the processes this collector can see.
    pub mapped: bool,
    /// The process name, or `unknown`: the name it publishes when its snapshot is collected
    /// too, else its command.
    pub process: String,
    /// Device memory the process uses; `None` when NVML cannot tell (no permission, vGPU, ...).
    pub used_bytes: Option<u64>,
    /// The pod it runs in (the node agent, when the pod is named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// Its PID namespace (`pid:[…]`), read when it could be mapped: joins it to a published
    /// snapshot of the same pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace: Option<String>,
    /// Whether a collected snapshot was merged onto it (the same process publishes).
    #[serde(default)]
    pub published: bool,
}

/// One process's published snapshot, as collected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CollectedProcess {
    pub pid: u32,
    pub process: String,
    /// What wrote the file (`gpumem 0.1.0`, `torch 2.4`, ...), when it said.
    pub writer: Option<String>,
    /// The file it came from, relative to the collect directory.
    pub file: String,
    /// When the process took it, in seconds since the Unix epoch.
    pub timestamp_seconds: f64,
    /// How old it was when collected.
    pub age_seconds: f64,
    pub devices: Vec<ProcessDevice>,
    /// The writer's PID namespace (`pid:[…]`), when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace: Option<String>,
    /// The pod of the NVML process it was joined to (the node agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// NVML's (host) pid of the process it was joined to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_pid: Option<u32>,
}

impl ProcessDevice {
    /// Whether this published device is `device` of the collector's own readings: the same UUID,
    /// or the same index when the writer gave none (CUDA and NVML may number devices apart).
    pub fn is(&self, device: &super::DeviceSnapshot) -> bool {
        match &self.uuid {
            Some(uuid) => *uuid == device.uuid,
            None => self.gpu as usize == device.index,
        }
    }
}

/// The device as the publishing process sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PublishedDeviceMemory {
    /// `cuMemGetInfo`'s total and free: the device, all processes.
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// The process's pressure level (0 low, 1 medium, 2 high, 3 critical) and used ratio, by
    /// its own thresholds; a reader computes them from the bytes when they are missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_level: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_used_ratio: Option<f64>,
}

/// One tag of a published device: what its live allocations hold (`gpumem_tag_*{tag}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessTag {
    /// The tag (`kv_cache`), `untagged`, or `other` for the tags beyond the largest few.
    pub tag: String,
    pub live_bytes: Option<u64>,
    pub live_allocations: Option<u64>,
    pub leak_suspect_bytes: Option<u64>,
    pub leak_suspect_allocations: Option<u64>,
}

/// One pool of a published device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessPool {
    /// A short name such as `small` or `large` (lowercase letters, digits, `_`).
    pub pool: String,
    pub reserved_bytes: Option<u64>,
    pub in_use_bytes: Option<u64>,
    pub requested_bytes: Option<u64>,
    pub cached_free_bytes: Option<u64>,
    pub largest_free_block_bytes: Option<u64>,
    pub fragmentation_ratio: Option<f64>,
    pub idle_pages: Option<u64>,
    pub live_allocations: Option<u64>,
    pub requests_total: Option<u64>,
    pub hits_total: Option<u64>,
    pub driver_allocs_total: Option<u64>,
    pub driver_frees_total: Option<u64>,
    pub driver_errors_total: Option<u64>,
}

/// How the collect directory is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectStatus {
    pub dir: String,
    /// Whether the latest scan could list the directory.
    pub readable: bool,
    /// Candidate files (`*.json`) seen in the latest scan.
    pub files: u64,
    /// Files skipped in the latest scan, by reason.
    pub rejected: Vec<ReasonCount>,
    /// Files skipped since the start, by reason (a file skipped in ten scans counts ten times).
    pub rejections_total: Vec<ReasonCount>,
    /// Processes whose series were dropped since the start, by reason (`stale`, `exited`).
    pub dropped_total: Vec<ReasonCount>,
    /// Scans that could not list the directory.
    pub dir_errors_total: u64,
    /// Scans that skipped files because the collected data was over its budget.
    #[serde(default)]
    pub budget_exceeded_total: u64,
    /// Set when the latest scan was over budget: what was skipped (for `/healthz`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_budget: Option<String>,
}

/// A count under a bounded reason (a metric label).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonCount {
    pub reason: String,
    pub count: u64,
}
