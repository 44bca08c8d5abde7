//! GPU processes that vanished while they held memory: NVML listed a process using device
//! memory, and the next reading of that device does not list it. When its pid is gone too, it
//! exited (or was killed, or OOM-killed); when its pod's container now runs under another
//! container ID, the container restarted. Either way its last reading — pod, container, what
//! it used — is kept as "exited" for the retention, as collected processes are, and the flight
//! recorder writes a record of it. A process that released the GPU and still runs is not kept:
//! nothing went wrong.

use gpumem_wire::{ExitedGpuProcess, GpuProcess, PodRef};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

/// Exited GPU processes listed at most (a crash loop must not grow the page without bound).
pub const MAX_EXITED_GPU: usize = 64;

/// Remembers the previous reading's processes and the exited ones.
pub struct GpuExitTracker {
    retention: Duration,
    /// The proc root the pids are checked under; `None` where pids cannot be checked (a
    /// collector outside the host's PID namespace).
    proc_root: Option<PathBuf>,
    /// By (host pid, device UUID).
    live: BTreeMap<(u32, String), GpuProcess>,
    exited: Vec<ExitedGpuProcess>,
}

impl GpuExitTracker {
    pub fn new(retention: Duration, proc_root: Option<PathBuf>) -> Self {
        GpuExitTracker {
            retention,
            proc_root,
            live: BTreeMap::new(),
            exited: Vec::new(),
        }
    }

    /// Compares this reading with the previous one. `read` holds the UUIDs of the devices
    /// whose process lists were read now: a device that could not be read says nothing about
    /// its processes. `current_id` tells the ID a pod's container runs under now. Returns the
    /// exited processes to list, newest first.
    pub fn update(
        &mut self,
        processes: &[GpuProcess],
        read: &HashSet<String>,
        now: f64,
        current_id: impl Fn(&PodRef) -> Option<String>,
    ) -> Vec<ExitedGpuProcess> {
        let mut live: BTreeMap<(u32, String), GpuProcess> = processes
            .iter()
            .map(|p| {
                let key = (p.nvml_pid, p.uuid.clone());
                // An exiting process leaves `/proc` before NVML stops listing it: it cannot be
                // mapped any more, but it is still who it was a moment ago.
                let known = self.live.get(&key).filter(|was| was.mapped && !p.mapped);
                let process = match known {
                    Some(was) => GpuProcess {
                        used_bytes: p.used_bytes.or(was.used_bytes),
                        ..was.clone()
                    },
                    None => p.clone(),
                };
                (key, process)
            })
            .collect();
        // Back again (a pid reused, a device read again): no longer exited.
        self.exited
            .retain(|e| !live.contains_key(&(e.last.nvml_pid, e.last.uuid.clone())));
        for (key, last) in std::mem::take(&mut self.live) {
            if live.contains_key(&key) {
                continue;
            }
            if !read.contains(&key.1) {
                // Not read this time: still what it was.
                live.insert(key, last);
                continue;
            }
            if last.used_bytes.unwrap_or(0) == 0 || self.still_runs(&last) {
                continue;
            }
            let restarted = last
                .pod
                .as_ref()
                .is_some_and(|pod| restarted(pod, processes, &current_id));
            let reason = if restarted { "restarted" } else { "exited" };
            tracing::warn!(
                "{} (pid {}{}) {} while holding {} on GPU {}; listed as exited for {}",
                last.process,
                last.nvml_pid,
                last.pod
                    .as_ref()
                    .map(|p| format!(", pod {}/{}", p.namespace, p.short()))
                    .unwrap_or_default(),
                if restarted {
                    "is gone: its container restarted"
                } else {
                    "is gone"
                },
                gpumem::units::Bytes(last.used_bytes.unwrap_or(0)),
                last.gpu,
                gpumem::units::format_duration(self.retention)
            );
            self.exited.insert(
                0,
                ExitedGpuProcess {
                    last,
                    exited_at_seconds: now,
                    reason: reason.to_string(),
                },
            );
        }
        self.live = live;
        let keep = self.retention.as_secs_f64();
        self.exited.retain(|e| now - e.exited_at_seconds <= keep);
        self.exited.truncate(MAX_EXITED_GPU);
        self.exited.clone()
    }

    /// Whether the process still runs (it only released the GPU): its pid is in the proc
    /// root and not a zombie. Unknown where pids cannot be checked, which counts as gone.
    fn still_runs(&self, process: &GpuProcess) -> bool {
        let Some(root) = &self.proc_root else {
            return false;
        };
        if !process.mapped {
            return false;
        }
        let dir = root.join(process.nvml_pid.to_string());
        if !dir.is_dir() {
            return false;
        }
        match std::fs::read_to_string(dir.join("stat")) {
            Ok(stat) => {
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next());
                !matches!(state, Some('Z' | 'X'))
            }
            Err(_) => true,
        }
    }
}

/// Whether `pod`'s container restarted: the pod list names another current ID for it, or a
/// process of the same pod runs now in a container the list does not name yet (one started
/// since the list; the list is asked for again, and names it shortly).
fn restarted(
    pod: &PodRef,
    now_running: &[GpuProcess],
    current_id: &impl Fn(&PodRef) -> Option<String>,
) -> bool {
    let current = current_id(pod);
    if current.is_some() && current != pod.container_id {
        return true;
    }
    now_running.iter().filter_map(|p| p.pod.as_ref()).any(|p| {
        p.uid == pod.uid
            && p.container.is_none()
            && p.container_id.is_some()
            && p.container_id != pod.container_id
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(host: u32, used: u64, container_id: &str) -> GpuProcess {
        GpuProcess {
            gpu: 0,
            uuid: "GPU-a".into(),
            pid: 1,
            nvml_pid: host,
            mapped: true,
            process: "python3".into(),
            used_bytes: Some(used),
            pod: Some(PodRef {
                namespace: "serving".into(),
                pod: "vllm-0".into(),
                container: Some("inference".into()),
                uid: "u".into(),
                container_id: Some(container_id.into()),
            }),
            ..GpuProcess::default()
        }
    }

    #[test]
    fn a_process_that_vanishes_holding_memory_is_kept_as_exited() {
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(root.path().join("300")).expect("mkdir");
        let mut tracker =
            GpuExitTracker::new(Duration::from_secs(60), Some(root.path().to_path_buf()));
        let read: HashSet<String> = ["GPU-a".to_string()].into();
        let none = |_: &PodRef| None;
        let all = [
            process(100, 30 << 30, "aaa"),
            process(200, 0, "bbb"),
            process(300, 1 << 30, "ccc"),
        ];
        assert!(tracker.update(&all, &read, 10.0, none).is_empty());
        // Not read: nothing is concluded.
        assert!(tracker.update(&[], &HashSet::new(), 11.0, none).is_empty());
        // Read, and all three are gone from NVML: 100 exited; 200 held nothing; 300 still runs.
        let exited = tracker.update(&[], &read, 12.0, none);
        assert_eq!(exited.len(), 1, "{exited:?}");
        assert_eq!(exited[0].last.nvml_pid, 100);
        assert_eq!(exited[0].reason, "exited");
        assert_eq!(tracker.update(&[], &read, 72.0, none).len(), 1);
        assert!(
            tracker.update(&[], &read, 72.5, none).is_empty(),
            "past the retention"
        );
    }

    #[test]
    fn a_process_gone_from_proc_before_nvml_keeps_its_pod() {
        let mut tracker = GpuExitTracker::new(Duration::from_secs(60), None);
        let read: HashSet<String> = ["GPU-a".to_string()].into();
        tracker.update(&[process(100, 8 << 30, "aaa")], &read, 1.0, |_| None);
        // Its /proc is gone, NVML still lists it for one more reading: unmapped, no pod.
        let unmapped = GpuProcess {
            mapped: false,
            pod: None,
            process: "unknown".into(),
            ..process(100, 8 << 30, "aaa")
        };
        assert!(tracker.update(&[unmapped], &read, 2.0, |_| None).is_empty());
        let exited = tracker.update(&[], &read, 3.0, |_| None);
        assert_eq!(exited.len(), 1);
        assert_eq!(exited[0].last.process, "python3");
        assert!(exited[0].last.pod.is_some(), "{exited:?}");
    }

    #[test]
    fn a_container_running_under_a_new_id_restarted() {
        let mut tracker = GpuExitTracker::new(Duration::from_secs(60), None);
        let read: HashSet<String> = ["GPU-a".to_string()].into();
        tracker.update(&[process(100, 8 << 30, "old")], &read, 1.0, |_| None);
        let now_new = |_: &PodRef| Some("new".to_string());
        let exited = tracker.update(&[process(101, 1 << 20, "new")], &read, 2.0, now_new);
        assert_eq!(exited[0].reason, "restarted");
        assert_eq!(
            exited[0].last.pod.as_ref().map(PodRef::short).as_deref(),
            Some("vllm-0 / inference")
        );
    }
}
