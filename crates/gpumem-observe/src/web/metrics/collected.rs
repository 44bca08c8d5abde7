//! What a collector (a sidecar or the node agent) adds to `/metrics`, read from
//! `Snapshot::collected()` — empty in-process, where every call here adds nothing: collected
//! processes' series (the manager and tag families of the parent module, labelled `process`,
//! `pid`, `gpu`, `uuid`), NVML's per-process memory, `gpumem_up{source=...}`, and the
//! collector's own health. Each field `f` of the publish
//! format's device is exported as `gpumem_f`, each pool field as `gpumem_pool_f`. A process the
//! node agent placed in a pod also carries `namespace`, `pod` and `container` (bounded: the
//! pods of one node, at most `pods::MAX_LABELLED_PODS`); the pod list's own health is here too.

use super::families::{PoolRecordValue, RecordValue};
use super::{def, sample, Def, Families, COUNTER, GAUGE};
use gpumem_wire::{
    CollectedProcess, CollectorSnapshot, PodRef, ProcessDevice, ProcessTag, ReasonCount,
};
use prometheus::proto::Metric;

const PROCESS_MEMORY: Def = def("gpumem_process_used_bytes", GAUGE, &["gpu", "uuid", "pid", "process", "namespace", "pod", "container"],
    "Device memory a compute process uses, from NVML; pid as this sidecar's PID namespace sees it where it can be mapped, else NVML's (host) pid; namespace, pod and container where the node agent named its pod.");
const POD_LIST_UP: Def = def("gpumem_pod_list_up", GAUGE, &[],
    "1 while the latest request for this node's pod list (the node agent's API server request) succeeded; 0 while it fails, when the previous list is still used.");
const POD_LIST_PODS: Def = def(
    "gpumem_pod_list_pods",
    GAUGE,
    &[],
    "Pods in the node's pod list the node agent holds now.",
);
const POD_LIST_AGE: Def = def(
    "gpumem_pod_list_age_seconds",
    GAUGE,
    &[],
    "Age of the node's pod list the node agent holds now.",
);
const POD_LIST_REQUESTS: Def = def(
    "gpumem_pod_list_requests_total",
    COUNTER,
    &[],
    "Requests for the node's pod list sent to the API server.",
);
const POD_LIST_ERRORS: Def = def(
    "gpumem_pod_list_errors_total",
    COUNTER,
    &[],
    "Requests for the node's pod list that failed; the reason is on /healthz.",
);
const POD_UNNAMED: Def = def("gpumem_pod_unattributed_processes", GAUGE, &["reason"],
    "GPU processes in a pod but without pod labels at the latest sample, by reason: unnamed (the pod list does not name the pod yet), unrecognised_cgroup (a cgroup shape this version does not know), over_cap (more pods than the label cap).");
const EXITED_GPU: Def = def("gpumem_exited_gpu_processes", GAUGE, &[],
    "GPU processes that vanished while holding memory (exited, killed, or their container restarted) within the exited retention; their last numbers and pod are on the page and in /api/v1/snapshot.");
const COLLECT_PROCESSES: Def = def("gpumem_collect_processes", GAUGE, &[],
    "Processes whose published snapshots are exported now: fresh (newer than three intervals) and with their pid alive.");
const COLLECT_FILES: Def = def(
    "gpumem_collect_files",
    GAUGE,
    &[],
    "Candidate files (*.json) in the collect directory at the latest scan.",
);
const COLLECT_REJECTED: Def = def("gpumem_collect_rejected_files", GAUGE, &["reason"],
    "Files skipped at the latest scan, by reason: empty, too_large, truncated, not_json, invalid, newer_version, unreadable, duplicate_pid, too_many_files, over_budget.");
const COLLECT_REJECTIONS: Def = def(
    "gpumem_collect_rejections_total",
    COUNTER,
    &["reason"],
    "Files skipped since the start, by reason (a file skipped at every scan counts at every scan).",
);
const COLLECT_DROPPED: Def = def("gpumem_collect_dropped_processes_total", COUNTER, &["reason"],
    "Processes whose series were dropped, by reason: stale (no new snapshot for three intervals) or exited (pid gone).");
const COLLECT_DIR_ERRORS: Def = def(
    "gpumem_collect_dir_errors_total",
    COUNTER,
    &[],
    "Scans that could not list the collect directory; the reason is on /healthz.",
);
const COLLECT_BUDGET: Def = def(
    "gpumem_collect_budget_exceeded_total",
    COUNTER,
    &[],
    "Scans that skipped files because the collected data was over its budget of series and bytes (serve --collect-max-series, --collect-max-bytes); what was skipped is on /healthz.",
);
const SNAPSHOT_AGE: Def = def(
    "gpumem_collect_snapshot_age_seconds",
    GAUGE,
    &["process", "pid"],
    "Age of each collected process's latest published snapshot when it was read.",
);

const EXITED: Def = def("gpumem_collect_exited_processes", GAUGE, &[],
    "Processes that stopped publishing (exited, killed or stale) within the exited retention (--exited-retention, 15 minutes by default); their last numbers are on the page and in /api/v1/snapshot.");

/// The families only a collector has.
pub(super) const DEFS: &[&Def] = &[
    &EXITED,
    &EXITED_GPU,
    &POD_LIST_UP,
    &POD_LIST_PODS,
    &POD_LIST_AGE,
    &POD_LIST_REQUESTS,
    &POD_LIST_ERRORS,
    &POD_UNNAMED,
    &PROCESS_MEMORY,
    &COLLECT_PROCESSES,
    &COLLECT_FILES,
    &COLLECT_REJECTED,
    &COLLECT_REJECTIONS,
    &COLLECT_DROPPED,
    &COLLECT_DIR_ERRORS,
    &COLLECT_BUDGET,
    &SNAPSHOT_AGE,
];

/// `namespace`, `pod` and `container` (when named) of a process placed in a pod; nothing for
/// others, which are named by `process` alone.
fn pod_labels(pod: Option<&PodRef>) -> Vec<(&'static str, &str)> {
    let Some(pod) = pod else {
        return Vec::new();
    };
    let mut labels = vec![
        ("namespace", pod.namespace.as_str()),
        ("pod", pod.pod.as_str()),
    ];
    if let Some(container) = &pod.container {
        labels.push(("container", container.as_str()));
    }
    labels
}

/// One device of one collected process, and the labels all its series carry.
struct ProcessSeries<'a> {
    process: &'a CollectedProcess,
    device: &'a ProcessDevice,
    pid: String,
    gpu: String,
}

impl<'a> ProcessSeries<'a> {
    /// `process`, `pid`, `gpu`, `uuid`, then `extra` (the pool, the tag), then the pod's.
    fn labels(&'a self, extra: Option<(&'static str, &'a str)>) -> Vec<(&'static str, &'a str)> {
        let mut labels = vec![
            ("process", self.process.process.as_str()),
            ("pid", self.pid.as_str()),
            ("gpu", self.gpu.as_str()),
            ("uuid", self.device.uuid.as_deref().unwrap_or("")),
        ];
        labels.extend(extra);
        labels.extend(pod_labels(self.process.pod.as_ref()));
        labels
    }
}

/// Every device of every collected process, in order.
fn process_series(collected: &CollectorSnapshot) -> impl Iterator<Item = ProcessSeries<'_>> {
    collected.processes.iter().flat_map(|process| {
        process.devices.iter().map(move |device| ProcessSeries {
            process,
            device,
            pid: process.pid.to_string(),
            gpu: device.gpu.to_string(),
        })
    })
}

/// `gpumem_up{source=...}`, one per source in use.
pub(super) fn up_samples(collected: &CollectorSnapshot) -> Vec<Metric> {
    collected
        .sources
        .iter()
        .map(|s| {
            sample(
                GAUGE,
                &[("source", s.source.as_str())],
                f64::from(u8::from(s.up)),
            )
        })
        .collect()
}

/// The collected processes' samples of one per-device family.
pub(super) fn process_device_samples(
    collected: &CollectorSnapshot,
    def: &Def,
    value: RecordValue,
) -> Vec<Metric> {
    process_series(collected)
        .filter_map(|series| {
            let v = value(series.device)?;
            Some(sample(def.kind, &series.labels(None), v))
        })
        .collect()
}

/// The collected processes' samples of one per-pool family.
pub(super) fn process_pool_samples(
    collected: &CollectorSnapshot,
    def: &Def,
    value: PoolRecordValue,
) -> Vec<Metric> {
    let mut samples = Vec::new();
    for series in process_series(collected) {
        for pool in &series.device.pools {
            if let Some(v) = value(pool) {
                let labels = series.labels(Some(("pool", pool.pool.as_str())));
                samples.push(sample(def.kind, &labels, v));
            }
        }
    }
    samples
}

/// The collected processes' samples of one `gpumem_tag_*` family.
pub(super) fn process_tag_samples(
    collected: &CollectorSnapshot,
    value: fn(&ProcessTag) -> Option<f64>,
) -> Vec<Metric> {
    let mut samples = Vec::new();
    for series in process_series(collected) {
        for tag in &series.device.tags {
            if let Some(v) = value(tag) {
                let labels = series.labels(Some(("tag", tag.tag.as_str())));
                samples.push(sample(GAUGE, &labels, v));
            }
        }
    }
    samples
}

/// The families only a collector has; none in-process, where nothing is collected.
pub(super) fn add_families(collected: &CollectorSnapshot, out: &mut Families) {
    let used = collected
        .gpu_processes
        .iter()
        .filter_map(|p| {
            let used = p.used_bytes? as f64;
            let (gpu, pid) = (p.gpu.to_string(), p.pid.to_string());
            let mut labels = vec![
                ("gpu", gpu.as_str()),
                ("uuid", p.uuid.as_str()),
                ("pid", pid.as_str()),
                ("process", p.process.as_str()),
            ];
            labels.extend(pod_labels(p.pod.as_ref()));
            Some(sample(GAUGE, &labels, used))
        })
        .collect();
    out.add(&PROCESS_MEMORY, used);
    if !collected.exited_gpu.is_empty() || collected.pods.is_some() {
        out.add(
            &EXITED_GPU,
            vec![sample(GAUGE, &[], collected.exited_gpu.len() as f64)],
        );
    }
    add_pod_families(collected, out);
    let Some(collect) = &collected.collect else {
        return;
    };
    let single = |def: &Def, value: f64| vec![sample(def.kind, &[], value)];
    let by_reason = |def: &Def, counts: &[ReasonCount]| {
        counts
            .iter()
            .map(|c| sample(def.kind, &[("reason", c.reason.as_str())], c.count as f64))
            .collect()
    };
    out.add(
        &COLLECT_PROCESSES,
        single(&COLLECT_PROCESSES, collected.processes.len() as f64),
    );
    out.add(&COLLECT_FILES, single(&COLLECT_FILES, collect.files as f64));
    out.add(&EXITED, single(&EXITED, collected.exited.len() as f64));
    out.add(
        &COLLECT_REJECTED,
        by_reason(&COLLECT_REJECTED, &collect.rejected),
    );
    out.add(
        &COLLECT_REJECTIONS,
        by_reason(&COLLECT_REJECTIONS, &collect.rejections_total),
    );
    out.add(
        &COLLECT_DROPPED,
        by_reason(&COLLECT_DROPPED, &collect.dropped_total),
    );
    out.add(
        &COLLECT_DIR_ERRORS,
        single(&COLLECT_DIR_ERRORS, collect.dir_errors_total as f64),
    );
    out.add(
        &COLLECT_BUDGET,
        single(&COLLECT_BUDGET, collect.budget_exceeded_total as f64),
    );
    let ages = collected
        .processes
        .iter()
        .map(|p| {
            let pid = p.pid.to_string();
            let mut labels = vec![("process", p.process.as_str()), ("pid", pid.as_str())];
            labels.extend(pod_labels(p.pod.as_ref()));
            sample(GAUGE, &labels, p.age_seconds)
        })
        .collect();
    out.add(&SNAPSHOT_AGE, ages);
}

/// The node agent's pod list: whether it is fresh, how big, and who it left unnamed.
fn add_pod_families(collected: &CollectorSnapshot, out: &mut Families) {
    let Some(pods) = &collected.pods else {
        return;
    };
    let single = |def: &Def, value: f64| vec![sample(def.kind, &[], value)];
    out.add(
        &POD_LIST_UP,
        single(&POD_LIST_UP, f64::from(u8::from(pods.up))),
    );
    if let Some(known) = pods.pods_known {
        out.add(&POD_LIST_PODS, single(&POD_LIST_PODS, known as f64));
    }
    if let Some(age) = pods.list_age_seconds {
        out.add(&POD_LIST_AGE, single(&POD_LIST_AGE, age));
    }
    out.add(
        &POD_LIST_REQUESTS,
        single(&POD_LIST_REQUESTS, pods.requests_total as f64),
    );
    out.add(
        &POD_LIST_ERRORS,
        single(&POD_LIST_ERRORS, pods.errors_total as f64),
    );
    let reasons = [
        ("unnamed", pods.unnamed_processes),
        ("unrecognised_cgroup", pods.unrecognised_cgroups),
        ("over_cap", pods.over_cap),
    ];
    out.add(
        &POD_UNNAMED,
        reasons
            .iter()
            .map(|(reason, n)| sample(GAUGE, &[("reason", reason)], *n as f64))
            .collect(),
    );
}

#[cfg(test)]
mod tests {
    use super::super::all_defs;
    use super::*;

    /// Every collector-only family is among the families `/metrics` declares.
    #[test]
    fn the_collector_families_are_declared() {
        let declared: Vec<&str> = all_defs().map(|d| d.name).collect();
        for def in DEFS {
            assert!(declared.contains(&def.name));
        }
    }
}
