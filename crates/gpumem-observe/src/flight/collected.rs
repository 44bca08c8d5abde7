//! The recorder in a collector (a sidecar or the node agent): devices it reads but holds no pools
//! on, and the collected processes whose published OOM counts went up, each with who else holds
//! memory on the device as the collector sees it.

use super::record::{device_history, OtherProcess, RecordDevice, RecordProcess};
use super::{blank, FlightRecord, FlightRecorder};
use crate::history::HistoryPoint;
use gpumem_wire::published::tag_groups;
use gpumem_wire::{CollectedProcess, CollectorSnapshot, DeviceSnapshot, ProcessDevice, Snapshot};

impl FlightRecorder {
    pub(super) fn observe_read_device(
        &mut self,
        device: &DeviceSnapshot,
        collected: &CollectorSnapshot,
        points: &[HistoryPoint],
        snapshot: &Snapshot,
    ) {
        let level = device.pressure.map(|p| p.level);
        let key = format!("device {}", device.uuid);
        let Some(due) = self.due(key, 0, level, false) else {
            return;
        };
        let (other_processes, note) = holders(device, collected, None);
        let record = FlightRecord {
            process: None,
            device: record_device(device, None),
            history: device_history(points, device.index, 0.0),
            other_processes,
            other_processes_note: note,
            ..blank(due, snapshot.timestamp_seconds)
        };
        self.finish(record);
    }

    pub(super) fn observe_collected(
        &mut self,
        process: &CollectedProcess,
        published: &ProcessDevice,
        collected: &CollectorSnapshot,
        points: &[HistoryPoint],
        snapshot: &Snapshot,
    ) {
        let Some(ooms) = published.ooms_total else {
            return;
        };
        let key = format!("{} {} gpu{}", process.process, process.pid, published.gpu);
        let Some(due) = self.due(key, ooms, None, false) else {
            return;
        };
        // The collector's own view of the device: join on the UUID, else on the index.
        let device = snapshot.devices.iter().find(|d| published.is(d));
        let (other_processes, note, mut record_dev, history) = match device {
            Some(d) => {
                let (others, note) = holders(d, collected, Some(process.pid));
                let history = device_history(points, d.index, 0.0);
                (others, note, record_device(d, Some(published)), history)
            }
            None => (
                Vec::new(),
                Some("the sidecar has no reading of this device".to_string()),
                RecordDevice::default(),
                Vec::new(),
            ),
        };
        record_dev.gpu = published.gpu as usize;
        let record = FlightRecord {
            process: Some(RecordProcess {
                pid: process.pid,
                process: process.process.clone(),
                pod: process.pod.clone().or_else(|| publisher_pod(collected)),
            }),
            device: record_dev,
            ooms_total: Some(ooms),
            oom_retries_total: published.oom_retries_total,
            pools: published.pools.clone(),
            top_tags: tag_groups(&published.tags),
            history,
            other_processes,
            other_processes_note: note,
            ..blank(due, snapshot.timestamp_seconds)
        };
        self.finish(record);
    }
}

/// In the sidecar shape (no pod attribution), a process that publishes into the sidecar's
/// directory runs in the sidecar's pod: the downward API names it.
fn publisher_pod(collected: &CollectorSnapshot) -> Option<gpumem_wire::PodRef> {
    if collected.pods.is_some() {
        return None;
    }
    let pod = collected.this_pod.as_ref()?;
    Some(gpumem_wire::PodRef {
        namespace: pod.namespace.clone(),
        pod: pod.pod.clone(),
        ..gpumem_wire::PodRef::default()
    })
}

/// The collector's reading of a device, with the publishing process's pool totals when known.
pub(super) fn record_device(
    device: &DeviceSnapshot,
    published: Option<&ProcessDevice>,
) -> RecordDevice {
    RecordDevice {
        gpu: device.index,
        uuid: device.uuid.clone(),
        name: device.name.clone(),
        memory: device.memory,
        pressure: device.pressure,
        reserved_bytes: published.and_then(|p| p.reserved_bytes),
        in_use_bytes: published.and_then(|p| p.in_use_bytes),
    }
}

/// Who holds memory on `device`, as the collector sees it: NVML's compute processes, then the
/// collected processes NVML does not list (their reserved bytes), leaving out `except`.
pub(super) fn holders(
    device: &DeviceSnapshot,
    collected: &CollectorSnapshot,
    except: Option<u32>,
) -> (Vec<OtherProcess>, Option<String>) {
    let mut others: Vec<OtherProcess> = collected
        .gpu_processes
        .iter()
        .filter(|p| p.uuid == device.uuid && Some(p.pid) != except)
        .map(|p| OtherProcess {
            pid: p.pid,
            process: p.process.clone(),
            used_bytes: p.used_bytes,
            source: "nvml".to_string(),
            pod: p.pod.clone(),
        })
        .collect();
    // A process joined to its NVML entry is listed once, above.
    let listed = collected
        .on_device(device)
        .filter(|(p, _)| Some(p.pid) != except && p.host_pid.is_none());
    for (process, published) in listed {
        others.push(OtherProcess {
            pid: process.pid,
            process: process.process.clone(),
            used_bytes: published.reserved_bytes,
            source: "published".to_string(),
            pod: process.pod.clone(),
        });
    }
    let nvml_up = collected.sources.iter().any(|s| s.source == "nvml" && s.up);
    let note =
        (!nvml_up).then(|| "no NVML: only processes that publish snapshots are listed".to_string());
    (others, note)
}
