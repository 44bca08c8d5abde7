//! What `gpumem serve` (the sidecar) adds to a snapshot: how its sources are doing (NVML, the
//! collect directory, ...), the processes NVML sees on each GPU, and the snapshots collected
//! from other processes. [`ProcessDevice`] and [`ProcessPool`] are also the body of the publish
//! format (`docs/publish-format.md`): every field `f` of a device is exported as `gpumem_f`, every
//! field `f` of a pool as `gpumem_pool_f`, labelled with the process and pid that published it.

use serde::{Deserialize, Serialize};

/// The sidecar's part of a snapshot; `None` in a snapshot of in-process managers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SidecarSnapshot {
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
}

/// A collected process that dropped out, kept for `--exited-retention` (15 min by default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitedProcess {
    /// Its last collected snapshot (peaks, OOM count, pools, tags).
    pub last: CollectedProcess,
    /// When the sidecar noticed, in seconds since the Unix epoch.
    pub exited_at_seconds: f64,
    /// `exited` (its pid is gone), `stale` (it stopped publishing), `stopped` (it removed its
    /// file, as a clean shutdown does).
    pub reason: String,
    /// Whether the sidecar removed the file it left behind.
    pub file_removed: bool,
}

impl SidecarSnapshot {
    /// The sources that do not work, as `source: reason` lines (for `/healthz` and the page).
    pub fn degraded(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter(|s| !s.up)
            .map(|s| format!("{}: {}", s.source, s.reason.as_deref().unwrap_or("down")))
            .collect()
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

/// One source of the sidecar's data: `nvml`, `cuda`, `sim` (device memory) or `collect`.
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
    /// The pid as this sidecar's PID namespace sees it when it could be mapped, else NVML's.
    pub pid: u32,
    /// The pid NVML reported (the host's PID namespace).
    pub nvml_pid: u32,
    /// Whether `pid` was found among the processes this sidecar can see.
    pub mapped: bool,
    /// The process name, or `unknown`.
    pub process: String,
    /// Device memory the process uses; `None` when NVML cannot tell (no permission, vGPU, ...).
    pub used_bytes: Option<u64>,
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
}

/// One device of a published snapshot. Everything but `gpu` is optional: a writer publishes
/// what it knows (PyTorch has no leak ages), and what is missing is not exported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessDevice {
    /// The device index in the publishing process (a CUDA index; join on `uuid` across hosts).
    pub gpu: u32,
    /// `GPU-…`, joinable with NVML's and dcgm-exporter's.
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub requested_bytes: Option<u64>,
    pub in_use_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    pub in_use_peak_bytes: Option<u64>,
    pub reserved_peak_bytes: Option<u64>,
    pub allocations_total: Option<u64>,
    pub frees_total: Option<u64>,
    pub driver_allocs_total: Option<u64>,
    pub driver_frees_total: Option<u64>,
    pub driver_errors_total: Option<u64>,
    pub ooms_total: Option<u64>,
    pub oom_retries_total: Option<u64>,
    pub cpu_fallbacks_total: Option<u64>,
    pub host_fallback_bytes: Option<u64>,
    pub live_allocations: Option<u64>,
    pub live_bytes: Option<u64>,
    pub leak_suspect_allocations: Option<u64>,
    pub leak_suspect_bytes: Option<u64>,
    pub oldest_allocation_age_seconds: Option<f64>,
    /// Device memory held for CUDA graphs, and the pools holding it (the device's
    /// `GraphSummary`): added within version 1, so a file from an older writer has neither and
    /// its graph series are simply not exported.
    #[serde(default)]
    pub graph_pool_bytes: Option<u64>,
    #[serde(default)]
    pub graph_pools: Option<u64>,
    /// Memory the process allocated outside gpumem and registered with `track_external`, and
    /// its buffers (the device's `ExternalSummary`): added within version 1, as the graph
    /// fields.
    #[serde(default)]
    pub external_bytes: Option<u64>,
    #[serde(default)]
    pub external_buffers: Option<u64>,
    #[serde(default)]
    pub pools: Vec<ProcessPool>,
    /// Live memory by tag (the largest tags, then `other`): added within version 1, so older
    /// writers leave it out and older readers ignore it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<ProcessTag>,
}

impl ProcessDevice {
    /// Whether this published device is `device` of the sidecar's own readings: the same UUID,
    /// or the same index when the writer gave none (CUDA and NVML may number devices apart).
    pub fn is(&self, device: &super::DeviceSnapshot) -> bool {
        match &self.uuid {
            Some(uuid) => *uuid == device.uuid,
            None => self.gpu as usize == device.index,
        }
    }
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
