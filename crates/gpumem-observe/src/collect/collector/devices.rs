//! Where the collector's device memory comes from: NVML (retried while missing), a test fixture
//! standing in for it, or a backend the user chose; and the device snapshots built from them.

use super::Collector;
use crate::nvml::{NvmlDevice, NvmlReader};
use gpumem::backend::{open_backend, sim::SimConfig, BackendChoice, BackendKind, DeviceBackend};
use gpumem::snapshot::CaptureSettings;
use gpumem_wire::{DeviceMemory, DeviceSnapshot, SourceStatus};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
/// How often a missing NVML is looked for again (the driver may come up after the collector).
const NVML_RETRY: Duration = Duration::from_secs(60);

/// A backend read for device memory, and its source name (`sim`, `cuda`).
pub(super) type NamedBackend = (Arc<dyn DeviceBackend>, &'static str);

/// NVML and how it is doing.
pub(super) struct NvmlState {
    library: Option<String>,
    reader: Result<NvmlReader, String>,
    last_attempt: Instant,
    /// Look for NVML again while it is missing (not when a fallback took over).
    retry: bool,
    /// Tests only: NVML's readings come from this file.
    fixture: Option<PathBuf>,
}

impl NvmlState {
    /// NVML's readings from a test fixture file instead of the library.
    pub(super) fn fixture(path: PathBuf) -> Self {
        tracing::warn!(
            "devices: a file standing in for NVML ({}); not a real device",
            path.display()
        );
        NvmlState {
            library: None,
            reader: Err("test fixture".to_string()),
            last_attempt: Instant::now(),
            retry: false,
            fixture: Some(path),
        }
    }

    /// The devices NVML sees, while it works.
    pub(super) fn device_count(&self) -> Option<usize> {
        self.reader.as_ref().ok().map(NvmlReader::device_count)
    }
}

pub(super) struct NvmlReading {
    pub(super) devices: Vec<NvmlDevice>,
}

/// NVML first; the CUDA fallback only when NVML is missing and a context is allowed.
pub(super) fn open_nvml(
    library: Option<String>,
    cuda_fallback: bool,
) -> (Option<NvmlState>, Option<NamedBackend>) {
    let reader = NvmlReader::open(library.as_deref());
    let mut backend = None;
    match &reader {
        Ok(reader) => tracing::info!(
            "devices: nvml ({}, {} device(s)); no CUDA context is created",
            reader.library(),
            reader.device_count()
        ),
        Err(reason) if cuda_fallback => {
            match open_backend(BackendChoice::Cuda, SimConfig::default()) {
                Ok(opened) => {
                    tracing::warn!(
                        "devices: cuda, because NVML is unavailable ({reason}); \
                         --allow-cuda-context: this creates a CUDA context on every device"
                    );
                    backend = Some((opened.backend, "cuda"));
                }
                Err(error) => tracing::warn!(
                    "devices: none; NVML is unavailable ({reason}) and so is CUDA ({error})"
                ),
            }
        }
        Err(reason) => tracing::warn!(
            "devices: none; NVML is unavailable ({reason}); serving collected snapshots only \
             (--allow-cuda-context would read device memory through CUDA, at the cost of a context)"
        ),
    }
    let retry = reader.is_err() && backend.is_none();
    let state = NvmlState {
        library,
        reader,
        last_attempt: Instant::now(),
        retry,
        fixture: None,
    };
    (Some(state), backend)
}

pub(super) fn source_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cuda => "cuda",
        BackendKind::Sim => "sim",
    }
}

pub(super) fn status(source: &str, up: bool, reason: Option<String>) -> SourceStatus {
    SourceStatus {
        source: source.to_string(),
        up,
        reason,
    }
}

/// NVML's total includes what the driver reserves for itself; `cuMemGetInfo`'s does not. Counting
/// total as used plus free makes the collector's numbers those of an in-process exporter on the
/// same device, and its "used" that of `nvidia-smi`.
pub(super) fn nvml_device(device: &NvmlDevice, settings: &CaptureSettings) -> DeviceSnapshot {
    let memory = device
        .memory
        .as_ref()
        .ok()
        .map(|m| (m.used.saturating_add(m.free), m.free));
    let mut snapshot = device_snapshot(device.index, memory, settings);
    snapshot.name = device.name.clone();
    snapshot.uuid = device.uuid.clone();
    snapshot
}

/// A device with only memory: the collector has no pools of its own. "Used" is total minus free,
/// as the in-process exporter counts it.
pub(super) fn device_snapshot(
    index: usize,
    memory: Option<(u64, u64)>,
    settings: &CaptureSettings,
) -> DeviceSnapshot {
    let memory = memory.map(|(total, free)| {
        let used = total.saturating_sub(free);
        DeviceMemory {
            total_bytes: total,
            free_bytes: free,
            used_bytes: used,
            used_by_this_process_bytes: 0,
            used_by_others_bytes: used,
        }
    });
    DeviceSnapshot {
        index,
        total_bytes: memory.map_or(0, |m| m.total_bytes),
        memory,
        pressure: memory.map(|m| settings.pressure.measure(m.used_bytes, m.total_bytes)),
        ..DeviceSnapshot::default()
    }
}

impl Collector {
    pub(super) fn read_nvml(&mut self, sources: &mut Vec<SourceStatus>) -> Option<NvmlReading> {
        let state = self.nvml.as_mut()?;
        if let Some(path) = &state.fixture {
            return match crate::collect::nvml_fixture::read(path) {
                Ok(devices) => {
                    sources.push(status("nvml", true, None));
                    Some(NvmlReading { devices })
                }
                Err(reason) => {
                    sources.push(status("nvml", false, Some(reason)));
                    None
                }
            };
        }
        if state.reader.is_err() && state.retry && state.last_attempt.elapsed() >= NVML_RETRY {
            state.last_attempt = Instant::now();
            state.reader = NvmlReader::open(state.library.as_deref());
            if let Ok(reader) = &state.reader {
                tracing::info!("devices: NVML is available now ({})", reader.library());
            }
        }
        let reader = match &state.reader {
            Ok(reader) => reader,
            Err(reason) => {
                sources.push(status("nvml", false, Some(reason.clone())));
                return None;
            }
        };
        let selection = self.selection.as_ref().map(|s| {
            s.iter()
                .copied()
                .filter(|&i| i < reader.device_count())
                .collect::<Vec<_>>()
        });
        match reader.read(selection.as_deref()) {
            Ok(devices) => {
                let failures: Vec<&str> = devices
                    .iter()
                    .filter_map(|d| d.memory.as_ref().err().map(String::as_str))
                    .collect();
                let up = failures.is_empty();
                sources.push(status("nvml", up, (!up).then(|| failures.join("; "))));
                Some(NvmlReading { devices })
            }
            Err(reason) => {
                sources.push(status("nvml", false, Some(reason)));
                None
            }
        }
    }

    pub(super) fn read_backend(
        &self,
        settings: &CaptureSettings,
        sources: &mut Vec<SourceStatus>,
    ) -> Vec<DeviceSnapshot> {
        let Some((backend, name)) = &self.backend else {
            return Vec::new();
        };
        let indices: Vec<usize> = match &self.selection {
            Some(selected) => selected.clone(),
            None => (0..backend.device_count()).collect(),
        };
        let mut failures = Vec::new();
        let mut devices = Vec::new();
        for index in indices {
            let properties = match backend.properties(index) {
                Ok(p) => p,
                Err(error) => {
                    failures.push(format!("device {index}: {error}"));
                    continue;
                }
            };
            let memory = match backend.mem_info(index) {
                Ok(info) => Some((info.total, info.free)),
                Err(error) => {
                    failures.push(format!("device {index}: {error}"));
                    None
                }
            };
            let mut device = device_snapshot(index, memory, settings);
            device.name = properties.name;
            device.uuid = properties.uuid;
            device.simulated = properties.simulated;
            device.total_bytes = memory.map_or(properties.total_memory_bytes, |(total, _)| total);
            devices.push(device);
        }
        let up = failures.is_empty();
        sources.push(status(name, up, (!up).then(|| failures.join("; "))));
        devices
    }
}
