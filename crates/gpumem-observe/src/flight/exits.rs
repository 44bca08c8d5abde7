//! Records of GPU processes that vanished while they held memory (the node agent's exited
//! GPU processes): the process and its pod, what it held, what the device held at that moment
//! and who else held it. One record per vanished process; a pod's container that keeps
//! crashing is recorded at most once per `min_gap`, as every other trigger.

use super::collected::{holders, record_device};
use super::record::{device_history, FlightRecord, RecordDevice, RecordProcess, Trigger};
use super::{blank, Due, FlightRecorder};
use crate::history::HistoryPoint;
use gpumem_wire::{CollectorSnapshot, ExitedGpuProcess, Snapshot};
use std::time::Instant;

impl FlightRecorder {
    /// Records each GPU process listed as exited that was not recorded yet.
    pub(super) fn observe_exits(
        &mut self,
        collected: &CollectorSnapshot,
        points: &[HistoryPoint],
        snapshot: &Snapshot,
    ) {
        let listed: Vec<(u32, String, u64)> = collected.exited_gpu.iter().map(key).collect();
        // Forget what is no longer listed: the set stays as small as the list.
        self.exits_recorded.retain(|k| listed.contains(k));
        for exited in &collected.exited_gpu {
            if !self.exits_recorded.insert(key(exited)) {
                continue;
            }
            if !self.exit_due(exited) {
                continue;
            }
            self.record_exit(exited, collected, points, snapshot);
        }
    }

    /// At most one record per pod container (or host pid outside pods) every `min_gap`.
    fn exit_due(&mut self, exited: &ExitedGpuProcess) -> bool {
        let last = &exited.last;
        let who = match &last.pod {
            Some(pod) => format!(
                "exit {}/{}/{}",
                pod.namespace,
                pod.pod,
                pod.container.as_deref().unwrap_or("")
            ),
            None => format!("exit pid {}", last.nvml_pid),
        };
        let min_gap = self.settings.min_gap;
        let watch = self.watched.entry(who).or_insert_with(|| super::Watch {
            ooms: 0,
            level: gpumem::manager::PressureLevel::Low,
            last_oom: None,
            last_critical: None,
            seen: Instant::now(),
        });
        watch.seen = Instant::now();
        if watch.last_oom.is_some_and(|t| t.elapsed() < min_gap) {
            return false;
        }
        watch.last_oom = Some(Instant::now());
        true
    }

    fn record_exit(
        &mut self,
        exited: &ExitedGpuProcess,
        collected: &CollectorSnapshot,
        points: &[HistoryPoint],
        snapshot: &Snapshot,
    ) {
        let last = &exited.last;
        let device = snapshot.devices.iter().find(|d| d.uuid == last.uuid);
        let (other_processes, note, record_dev, history) = match device {
            Some(d) => {
                // It is no longer listed: every holder left is another process.
                let (others, note) = holders(d, collected, None);
                let history = device_history(points, d.index, 0.0);
                (others, note, record_device(d, None), history)
            }
            None => (
                Vec::new(),
                Some("the node agent has no reading of this device now".to_string()),
                RecordDevice {
                    gpu: last.gpu,
                    uuid: last.uuid.clone(),
                    ..RecordDevice::default()
                },
                Vec::new(),
            ),
        };
        let due = Due {
            trigger: Trigger::Exited,
            new_ooms: 0,
            previous_ooms: 0,
        };
        let record = FlightRecord {
            process: Some(RecordProcess {
                pid: last.nvml_pid,
                process: last.process.clone(),
                pod: last.pod.clone(),
            }),
            device: record_dev,
            history,
            other_processes,
            other_processes_note: note,
            held_bytes: last.used_bytes,
            exit_reason: Some(exited.reason.clone()),
            ..blank(due, snapshot.timestamp_seconds)
        };
        self.finish(record);
    }
}

/// One exited process, once: its host pid, device and the moment it was seen gone.
fn key(exited: &ExitedGpuProcess) -> (u32, String, u64) {
    (
        exited.last.nvml_pid,
        exited.last.uuid.clone(),
        exited.exited_at_seconds.to_bits(),
    )
}
