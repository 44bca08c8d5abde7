//! The recorder inside an engine process: its own devices, whose OOM counts start at 0, with
//! the requests refused, its pools and tags, and the other processes NVML lists on the device.

use super::record::{self, device_history, OtherProcess, RecordDevice};
use super::{FlightRecord, FlightRecorder};
use crate::history::HistoryPoint;
use crate::nvml::NvmlReader;
use gpumem::units::Bytes;
use gpumem_wire::published::published_pool;
use gpumem_wire::DeviceSnapshot;

impl FlightRecorder {
    pub(super) fn observe_own(
        &mut self,
        device: &DeviceSnapshot,
        points: &[HistoryPoint],
        now: f64,
    ) {
        let level = device.pressure.map(|p| p.level);
        let key = format!("gpu{}", device.index);
        let Some(due) = self.due(key, device.stats.ooms, level, true) else {
            return;
        };
        let (other_processes, note) = self.nvml_processes(device);
        let recent: Vec<_> = device
            .recent_ooms
            .iter()
            .filter(|e| e.seq > due.previous_ooms)
            .cloned()
            .collect();
        let stats = &device.stats;
        let record = FlightRecord {
            format: record::FORMAT.to_string(),
            version: record::VERSION,
            trigger: due.trigger,
            timestamp_seconds: now,
            file: None,
            summary: String::new(),
            process: Some(self.this_process.clone()),
            device: RecordDevice {
                gpu: device.index,
                uuid: device.uuid.clone(),
                name: device.name.clone(),
                memory: device.memory,
                pressure: device.pressure,
                reserved_bytes: Some(stats.pools.reserved_bytes),
                in_use_bytes: Some(stats.pools.in_use_bytes),
            },
            request: recent.last().cloned(),
            ooms_since_previous: due.new_ooms,
            recent_ooms: recent,
            ooms_total: Some(stats.ooms),
            oom_retries_total: Some(stats.oom_retries),
            pools: device.pools.iter().map(published_pool).collect(),
            top_tags: device.by_tag.clone(),
            history: device_history(points, device.index, 0.0),
            other_processes,
            other_processes_note: note,
            held_bytes: None,
            exit_reason: None,
            recorded_in: None,
        };
        self.finish(record);
    }

    /// Compute processes NVML lists on the device (in-process, where NVML is present).
    fn nvml_processes(&mut self, device: &DeviceSnapshot) -> (Vec<OtherProcess>, Option<String>) {
        let others = device
            .memory
            .map(|m| {
                format!(
                    "; {} used by others in total",
                    Bytes(m.used_by_others_bytes)
                )
            })
            .unwrap_or_default();
        if device.simulated {
            return (
                Vec::new(),
                Some(format!("simulated device: no NVML{others}")),
            );
        }
        let reader = self.nvml.get_or_insert_with(|| NvmlReader::open(None));
        let reader = match reader {
            Ok(reader) => reader,
            Err(reason) => {
                return (
                    Vec::new(),
                    Some(format!("NVML unavailable: {reason}{others}")),
                )
            }
        };
        let devices = match reader.read(None) {
            Ok(devices) => devices,
            Err(reason) => return (Vec::new(), Some(format!("NVML failed: {reason}{others}"))),
        };
        let Some(found) = devices.into_iter().find(|d| d.uuid == device.uuid) else {
            return (
                Vec::new(),
                Some(format!("NVML does not list {}{others}", device.uuid)),
            );
        };
        match found.processes {
            Ok(list) => (
                list.into_iter()
                    .map(|p| OtherProcess {
                        pid: p.pid,
                        process: p.name.as_deref().map_or_else(
                            || "unknown".to_string(),
                            gpumem_wire::process::clean_process_name,
                        ),
                        used_bytes: p.used_bytes,
                        source: "nvml".to_string(),
                        pod: None,
                    })
                    .collect(),
                None,
            ),
            Err(reason) => (
                Vec::new(),
                Some(format!("NVML process list failed: {reason}{others}")),
            ),
        }
    }
}
