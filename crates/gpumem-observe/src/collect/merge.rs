//! Joining what a process publishes to what NVML says of it: one process, one identity. A
//! collected snapshot and an NVML process are the same process when
//!
//! 1. the pid the snapshot publishes (the process's own view, `os.getpid()`) equals the NVML
//!    process's pid after translation into its innermost PID namespace (`NStgid`), and
//! 2. their PID namespaces agree: the snapshot's `pid_namespace` equals the link
//!    `<proc root>/<host pid>/ns/pid` of the NVML process. Where either is unknown (an older
//!    writer, a `/proc` that hides the link) the pid alone decides, and only if exactly one NVML
//!    process has it — many containers run their engine as pid 1. (Reading another user's
//!    `ns/pid` link needs ptrace access to it, which an unprivileged agent lacks; the pid
//!    decides there.)
//!
//! Only NVML processes on a device the snapshot lists (by UUID, where it gives them) are
//! candidates: engines that are pid 1 of their pods rarely share a GPU.
//!
//! Joined, the NVML process takes the name the engine publishes, and the collected process the
//! pod the NVML process runs in and its host pid, so its pools and tags carry the same
//! `pid`, `process`, `namespace`, `pod` and `container` labels as its `gpumem_process_used_bytes`.

use gpumem_wire::{CollectedProcess, GpuProcess, PodRef};
use std::collections::HashMap;

/// Keeps every NVML process's series its own: two processes of one GPU whose own pids are the
/// same (the pid 1 of two containers) and that no pod tells apart would export the same
/// labels; those are labelled with their host pids instead. Run before [`merge`], which only
/// joins processes whose pid is their own.
pub fn distinct_pids(gpu: &mut [GpuProcess]) {
    let key = |g: &GpuProcess| {
        (
            g.gpu,
            g.pid,
            g.pod
                .as_ref()
                .map(|p| (p.uid.clone(), p.container_id.clone())),
        )
    };
    let clashing: Vec<bool> = gpu
        .iter()
        .map(|g| {
            gpu.iter()
                .any(|other| other.nvml_pid != g.nvml_pid && key(other) == key(g))
        })
        .collect();
    for (entry, clashes) in gpu.iter_mut().zip(clashing) {
        if clashes {
            entry.pid = entry.nvml_pid;
            // The pid is no longer the process's own view: nothing may join it by that.
            entry.mapped = false;
        }
    }
}

/// Joins `collected` to `gpu` in place; see the module documentation.
pub fn merge(gpu: &mut [GpuProcess], collected: &mut [CollectedProcess]) {
    for process in collected.iter_mut() {
        let Some(host_pid) = matching_host_pid(gpu, process) else {
            continue;
        };
        let mut pod = None;
        for entry in gpu.iter_mut().filter(|g| g.nvml_pid == host_pid) {
            entry.process = process.process.clone();
            entry.published = true;
            pod = pod.or_else(|| entry.pod.clone());
        }
        process.pod = pod;
        process.host_pid = Some(host_pid);
    }
}

/// What a published process was last joined to (its pod and NVML's host pid), by the process's
/// own identity: name, pid and PID namespace. When its NVML process vanishes (killed, its
/// container restarted), the file it left is still collected until it goes stale; without this
/// its series would lose their pod labels for those seconds, and its exit record its pod.
#[derive(Debug, Default)]
pub struct LastJoined {
    by_process: HashMap<ProcessKey, (PodRef, Option<u32>)>,
}

type ProcessKey = (String, u32, Option<String>);

impl LastJoined {
    /// Gives each process NVML no longer names the pod and host pid it was last joined to, and
    /// remembers those of every process still collected (no others: the table stays as small
    /// as the collect directory). A restarted container runs in a new PID namespace, so its
    /// new process never takes the old one's pod by mistake.
    pub fn fill(&mut self, collected: &mut [CollectedProcess]) {
        let mut still = HashMap::new();
        for process in collected {
            let key = (
                process.process.clone(),
                process.pid,
                process.pid_namespace.clone(),
            );
            match &process.pod {
                Some(pod) => {
                    still.insert(key, (pod.clone(), process.host_pid));
                }
                None => {
                    if let Some((pod, host_pid)) = self.by_process.remove(&key) {
                        process.pod = Some(pod.clone());
                        process.host_pid = process.host_pid.or(host_pid);
                        still.insert(key, (pod, process.host_pid));
                    }
                }
            }
        }
        self.by_process = still;
    }
}

/// The host pid of the one NVML process `process` is, if any.
fn matching_host_pid(gpu: &[GpuProcess], process: &CollectedProcess) -> Option<u32> {
    let uuids: Vec<&str> = process
        .devices
        .iter()
        .filter_map(|d| d.uuid.as_deref())
        .collect();
    let mut candidates: Vec<&GpuProcess> = gpu
        .iter()
        .filter(|g| g.mapped && g.pid == process.pid)
        .filter(|g| uuids.is_empty() || uuids.contains(&g.uuid.as_str()))
        .collect();
    // One NVML process per host pid (it is listed once per GPU it uses).
    candidates.sort_by_key(|g| g.nvml_pid);
    candidates.dedup_by_key(|g| g.nvml_pid);
    let agreeing: Vec<&&GpuProcess> = candidates
        .iter()
        .filter(|g| match (&process.pid_namespace, &g.pid_namespace) {
            (Some(published), Some(seen)) => published == seen,
            _ => false,
        })
        .collect();
    match (agreeing.as_slice(), candidates.as_slice()) {
        ([one], _) => Some(one.nvml_pid),
        // The namespaces cannot decide: the pid can, when it is unambiguous and neither side
        // contradicts it.
        ([], [one]) if process.pid_namespace.is_none() || one.pid_namespace.is_none() => {
            Some(one.nvml_pid)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvml(host: u32, pid: u32, ns: Option<&str>, pod: Option<&str>) -> GpuProcess {
        GpuProcess {
            pid,
            nvml_pid: host,
            mapped: true,
            process: "python3".into(),
            pid_namespace: ns.map(String::from),
            pod: pod.map(|p| PodRef {
                namespace: "serving".into(),
                pod: p.into(),
                container: Some("engine".into()),
                ..PodRef::default()
            }),
            ..GpuProcess::default()
        }
    }

    fn published(pid: u32, ns: Option<&str>) -> CollectedProcess {
        CollectedProcess {
            pid,
            process: "vllm-engine".into(),
            pid_namespace: ns.map(String::from),
            ..CollectedProcess::default()
        }
    }

    #[test]
    fn a_process_keeps_its_pod_after_its_nvml_process_is_gone() {
        let mut last = LastJoined::default();
        let mut gpu = vec![nvml(5000, 1, Some("pid:[1]"), Some("vllm-0"))];
        let mut collected = vec![published(1, Some("pid:[1]"))];
        merge(&mut gpu, &mut collected);
        last.fill(&mut collected);
        // NVML no longer lists it; its file is still collected; a new container's engine is
        // pid 1 of another namespace.
        let mut collected = vec![published(1, Some("pid:[1]")), published(1, Some("pid:[2]"))];
        merge(&mut [], &mut collected);
        last.fill(&mut collected);
        assert_eq!(
            collected[0].pod.as_ref().map(|p| p.pod.as_str()),
            Some("vllm-0")
        );
        assert_eq!(collected[0].host_pid, Some(5000));
        assert_eq!(
            collected[1].pod, None,
            "another namespace's pid 1 is another process"
        );
        // Once its file is gone, it is forgotten.
        last.fill(&mut []);
        let mut back = vec![published(1, Some("pid:[1]"))];
        last.fill(&mut back);
        assert_eq!(back[0].pod, None);
    }

    #[test]
    fn the_same_pid_in_the_same_namespace_is_one_process() {
        // Two pods, both running their engine as pid 1.
        let mut gpu = vec![
            nvml(4121, 1, Some("pid:[401]"), Some("vllm-0")),
            nvml(5000, 1, Some("pid:[402]"), Some("vllm-1")),
        ];
        let mut collected = vec![published(1, Some("pid:[402]"))];
        merge(&mut gpu, &mut collected);
        assert_eq!(collected[0].host_pid, Some(5000));
        assert_eq!(
            collected[0].pod.as_ref().map(|p| p.pod.as_str()),
            Some("vllm-1")
        );
        assert_eq!(gpu[1].process, "vllm-engine");
        assert!(gpu[1].published && !gpu[0].published);
        assert_eq!(gpu[0].process, "python3");
    }

    #[test]
    fn without_namespaces_only_an_unambiguous_pid_joins() {
        let mut gpu = vec![
            nvml(4121, 1, None, Some("vllm-0")),
            nvml(5000, 1, None, Some("vllm-1")),
            nvml(6000, 7, None, None),
        ];
        let mut collected = vec![published(1, None), published(7, Some("pid:[9]"))];
        merge(&mut gpu, &mut collected);
        assert_eq!(collected[0].host_pid, None, "pid 1 twice: ambiguous");
        assert_eq!(collected[1].host_pid, Some(6000));
        // A namespace that contradicts the only candidate does not join.
        let mut gpu = vec![nvml(6000, 7, Some("pid:[8]"), None)];
        let mut collected = vec![published(7, Some("pid:[9]"))];
        merge(&mut gpu, &mut collected);
        assert_eq!(collected[0].host_pid, None);
    }

    #[test]
    fn two_pid_1s_on_one_gpu_outside_pods_keep_their_host_pids() {
        let mut gpu = vec![
            nvml(4121, 1, None, None),
            nvml(5000, 1, None, None),
            nvml(6000, 1, None, Some("vllm-0")),
            nvml(7000, 9, None, None),
        ];
        distinct_pids(&mut gpu);
        let pids: Vec<u32> = gpu.iter().map(|g| g.pid).collect();
        assert_eq!(pids, [4121, 5000, 1, 9]);
        assert!(!gpu[0].mapped && gpu[2].mapped && gpu[3].mapped);
    }

    #[test]
    fn the_devices_a_snapshot_lists_tell_two_pid_1s_apart() {
        let mut on_a = nvml(4121, 1, None, Some("vllm-0"));
        on_a.uuid = "GPU-a".into();
        let mut on_b = nvml(5000, 1, None, Some("vllm-1"));
        on_b.uuid = "GPU-b".into();
        let mut gpu = vec![on_a, on_b];
        let mut collected = vec![published(1, None)];
        collected[0].devices = vec![gpumem_wire::ProcessDevice {
            uuid: Some("GPU-b".into()),
            ..Default::default()
        }];
        merge(&mut gpu, &mut collected);
        assert_eq!(collected[0].host_pid, Some(5000));
    }

    #[test]
    fn a_process_on_two_gpus_is_renamed_on_both() {
        let mut second = nvml(4121, 1, Some("pid:[401]"), Some("vllm-0"));
        second.gpu = 1;
        let mut gpu = vec![nvml(4121, 1, Some("pid:[401]"), Some("vllm-0")), second];
        let mut collected = vec![published(1, Some("pid:[401]"))];
        merge(&mut gpu, &mut collected);
        assert!(gpu
            .iter()
            .all(|g| g.process == "vllm-engine" && g.published));
        // Unmapped NVML processes (pids of another namespace) never join.
        let mut gpu = vec![GpuProcess {
            mapped: false,
            ..nvml(1, 1, None, None)
        }];
        let mut collected = vec![published(1, None)];
        merge(&mut gpu, &mut collected);
        assert_eq!(collected[0].host_pid, None);
    }
}
