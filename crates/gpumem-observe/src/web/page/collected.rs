//! What a collector (a sidecar or the node agent) adds to the status page: its sources (and the
//! node agent's pod list), the processes whose snapshots it collects, the compute processes
//! NVML sees with their pods, and those that went away — as ready-to-print rows.

use super::super::format;
use gpumem_wire::{
    CollectStatus, CollectedProcess, CollectorSnapshot, ExitedGpuProcess, GpuProcess, PodRef,
    PodsStatus,
};

pub(crate) struct CollectedView {
    pub sources: Vec<SourceRow>,
    /// Whether `--collect-dir` is set (the processes table is shown only then).
    pub collecting: bool,
    /// "Collecting from /run/gpumem: 3 files, 1 skipped (truncated: 1)".
    pub collect_summary: String,
    pub processes: Vec<ProcessRow>,
    pub gpu_processes: Vec<GpuProcessRow>,
    /// Processes that stopped publishing lately, one row per device, newest first, then GPU
    /// processes that vanished holding memory.
    pub exited: Vec<ExitedRow>,
    /// "serving/vllm-0": the pod this gpumem runs in (the downward API); empty when not told.
    pub this_pod: String,
    /// The node agent's pod list, as a source row; `None` without a pod source.
    pub pods: Option<SourceRow>,
    /// Whether any process has a pod (the Pod columns are shown only then).
    pub any_pod: bool,
}

/// One device of an exited process, with its last numbers.
pub(crate) struct ExitedRow {
    pub process: String,
    /// "serving/vllm-0 / inference", or "–".
    pub pod: String,
    pub pid: u32,
    pub gpu: u32,
    /// `exited`, `stale` or `stopped`.
    pub reason: String,
    pub reserved: String,
    pub peak_reserved: String,
    pub ooms: String,
    pub ooms_warn: bool,
    pub leaks: String,
    pub gone_for: String,
}

pub(crate) struct SourceRow {
    pub source: String,
    pub up: bool,
    pub reason: String,
}

/// One device of one collected process.
pub(crate) struct ProcessRow {
    pub process: String,
    pub pod: String,
    pub pid: u32,
    pub gpu: u32,
    /// The device's UUID (joins the row to its device section).
    pub uuid: String,
    pub reserved: String,
    /// Raw, for scripts and tests (`data-reserved-bytes`); 0 when unknown.
    pub reserved_bytes: u64,
    pub in_use: String,
    pub peak_reserved: String,
    pub live: String,
    /// "2 pools, 52.00 MiB" while the process holds memory for CUDA graphs, else "–".
    pub graphs: String,
    pub leaks: String,
    pub leaks_warn: bool,
    pub ooms: String,
    pub age: String,
}

pub(crate) struct GpuProcessRow {
    pub gpu: usize,
    pub pid: u32,
    pub process: String,
    pub pod: String,
    pub used: String,
    /// "host pid 123456" when the pid could not be mapped to this namespace.
    pub note: String,
}

impl CollectedView {
    pub(crate) fn new(collected: &CollectorSnapshot) -> Self {
        CollectedView {
            sources: collected
                .sources
                .iter()
                .map(|s| SourceRow {
                    source: s.source.clone(),
                    up: s.up,
                    reason: s.reason.clone().unwrap_or_default(),
                })
                .collect(),
            collecting: collected.collect.is_some(),
            collect_summary: collected.collect.as_ref().map(summary).unwrap_or_default(),
            processes: collected.processes.iter().flat_map(process_rows).collect(),
            gpu_processes: collected
                .gpu_processes
                .iter()
                .map(gpu_process_row)
                .collect(),
            this_pod: collected
                .this_pod
                .as_ref()
                .map(|p| format!("{}/{}", p.namespace, p.pod))
                .unwrap_or_default(),
            pods: collected.pods.as_ref().map(pods_row),
            any_pod: collected.gpu_processes.iter().any(|p| p.pod.is_some())
                || collected.processes.iter().any(|p| p.pod.is_some())
                || collected.exited_gpu.iter().any(|e| e.last.pod.is_some()),
            exited: collected
                .exited
                .iter()
                .flat_map(|e| {
                    let gone_for = format::age(gpumem_wire::unix_now() - e.exited_at_seconds);
                    e.last.devices.iter().map(move |d| ExitedRow {
                        process: e.last.process.clone(),
                        pod: pod_text(e.last.pod.as_ref()),
                        pid: e.last.pid,
                        gpu: d.gpu,
                        reason: e.reason.clone(),
                        reserved: optional_bytes(d.reserved_bytes),
                        peak_reserved: optional_bytes(d.reserved_peak_bytes),
                        ooms: optional_count(d.ooms_total),
                        ooms_warn: d.ooms_total.is_some_and(|n| n > 0),
                        leaks: optional_bytes(d.leak_suspect_bytes),
                        gone_for: gone_for.clone(),
                    })
                })
                .chain(collected.exited_gpu.iter().map(exited_gpu_row))
                .collect(),
        }
    }
}

/// "serving/vllm-0 / inference", or "–" outside a pod.
fn pod_text(pod: Option<&PodRef>) -> String {
    pod.map_or_else(
        || "–".to_string(),
        |p| format!("{}/{}", p.namespace, p.short()),
    )
}

fn pods_row(pods: &PodsStatus) -> SourceRow {
    let age = pods
        .list_age_seconds
        .map(|a| format!(", list {} old", format::age(a)))
        .unwrap_or_default();
    let known = pods
        .pods_known
        .map_or_else(|| "no list yet".to_string(), |n| format!("{n} pod(s)"));
    let mut reason = format!("node {}: {known}{age}", pods.node);
    if let Some(why) = &pods.reason {
        reason.push_str(&format!("; {why}"));
    }
    for (count, what) in [
        (pods.unnamed_processes, "in pods not listed yet"),
        (pods.unrecognised_cgroups, "with an unknown cgroup shape"),
        (pods.over_cap, "over the label cap"),
    ] {
        if count > 0 {
            reason.push_str(&format!("; {count} process(es) {what}"));
        }
    }
    SourceRow {
        source: format!("{} (pod names)", pods.source),
        up: pods.up,
        reason,
    }
}

/// A GPU process that vanished holding memory, as a row of the exited table.
fn exited_gpu_row(e: &ExitedGpuProcess) -> ExitedRow {
    ExitedRow {
        process: e.last.process.clone(),
        pod: pod_text(e.last.pod.as_ref()),
        pid: e.last.pid,
        gpu: u32::try_from(e.last.gpu).unwrap_or(u32::MAX),
        reason: e.reason.clone(),
        reserved: optional_bytes(e.last.used_bytes),
        peak_reserved: "–".to_string(),
        ooms: "–".to_string(),
        ooms_warn: false,
        leaks: "–".to_string(),
        gone_for: format::age(gpumem_wire::unix_now() - e.exited_at_seconds),
    }
}

fn summary(collect: &CollectStatus) -> String {
    let skipped: Vec<String> = collect
        .rejected
        .iter()
        .filter(|r| r.count > 0)
        .map(|r| format!("{} {}", r.count, r.reason.replace('_', " ")))
        .collect();
    let state = if collect.readable {
        format!("{} file(s)", collect.files)
    } else {
        "the directory cannot be read".to_string()
    };
    if skipped.is_empty() {
        format!("{} — {state}", collect.dir)
    } else {
        format!("{} — {state}; skipped: {}", collect.dir, skipped.join(", "))
    }
}

fn optional_bytes(value: Option<u64>) -> String {
    value.map_or_else(|| "–".to_string(), format::bytes)
}

fn optional_count(value: Option<u64>) -> String {
    value.map_or_else(|| "–".to_string(), format::count)
}

fn process_rows(process: &CollectedProcess) -> Vec<ProcessRow> {
    process
        .devices
        .iter()
        .map(|d| ProcessRow {
            process: process.process.clone(),
            pod: pod_text(process.pod.as_ref()),
            pid: process.pid,
            gpu: d.gpu,
            uuid: d.uuid.clone().unwrap_or_default(),
            reserved: optional_bytes(d.reserved_bytes),
            reserved_bytes: d.reserved_bytes.unwrap_or(0),
            in_use: optional_bytes(d.in_use_bytes),
            peak_reserved: optional_bytes(d.reserved_peak_bytes),
            live: optional_count(d.live_allocations),
            graphs: match (d.graph_pools, d.graph_pool_bytes) {
                (Some(pools), Some(bytes)) if pools > 0 => format::graph_pools(pools, bytes),
                _ => "–".to_string(),
            },
            leaks: optional_bytes(d.leak_suspect_bytes),
            leaks_warn: d.leak_suspect_bytes.is_some_and(|b| b > 0),
            ooms: optional_count(d.ooms_total),
            age: format::age(process.age_seconds),
        })
        .collect()
}

fn gpu_process_row(p: &GpuProcess) -> GpuProcessRow {
    GpuProcessRow {
        gpu: p.gpu,
        pid: p.pid,
        process: p.process.clone(),
        pod: pod_text(p.pod.as_ref()),
        used: optional_bytes(p.used_bytes),
        note: match (p.mapped, p.published) {
            (false, _) => "host pid, not visible from this PID namespace".to_string(),
            (true, true) => "publishes its snapshot (see Processes)".to_string(),
            (true, false) => String::new(),
        },
    }
}
