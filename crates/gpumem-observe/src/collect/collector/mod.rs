//! The collector: the [`SnapshotSource`] of `gpumem serve`, as a sidecar or as the node agent.
//! Device memory from NVML — or from a backend the user chose (`--backend sim`, or CUDA when a
//! context is explicitly allowed) — NVML's per-process memory mapped to the pids this collector
//! can see, and the collected files. No source is fatal: each reports whether it works
//! (`gpumem_up{source=...}`) and why not. As the node agent it also names each GPU process's
//! pod (`crate::pods`), joins what processes publish to what NVML says of them (`merge`), keeps
//! GPU processes that vanished holding memory (`gpu_exited`), and without any device source
//! reads the devices as the publishers see them (`published_devices`). Reading the device
//! sources is `devices`.

mod devices;

use super::collect_dir::{CollectDir, CollectSettings};
use super::gpu_exited::GpuExitTracker;
use crate::nvml::PidMapper;
use crate::pods::{PodAttributor, PodDirectory};
use crate::sampler::SnapshotSource;
use devices::{nvml_device, open_nvml, source_name, status, NamedBackend, NvmlReading, NvmlState};
use gpumem::backend::DeviceBackend;
use gpumem::snapshot::CaptureSettings;
use gpumem_wire::{unix_now, CollectorSnapshot, DeviceSnapshot, GpuProcess, Snapshot, ThisPod};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Where device memory comes from.
pub enum DeviceSource {
    /// NVML (no CUDA context). When it is unavailable and `cuda_fallback` is set, the CUDA
    /// driver's `cuMemGetInfo` instead, which creates a context on each device.
    Nvml {
        library: Option<String>,
        cuda_fallback: bool,
    },
    /// A backend the caller opened: the simulated device, or CUDA when a context is allowed.
    Backend(Arc<dyn DeviceBackend>),
    /// For tests only: a file saying what NVML would (`super::nvml_fixture`).
    NvmlFixture(PathBuf),
}

/// See the module documentation.
pub struct Collector {
    nvml: Option<NvmlState>,
    backend: Option<NamedBackend>,
    /// Device indices to report (of the device source); `None` for all.
    selection: Option<Vec<usize>>,
    pids: PidMapper,
    collect_dir: Option<CollectDir>,
    exited: Option<super::exited::ExitedTracker>,
    /// Where pids are looked up (`/proc`, or the host's `/proc` mounted elsewhere).
    proc_root: PathBuf,
    /// Names GPU processes' pods (the node agent); `None` without a pod source.
    attributor: Option<PodAttributor>,
    gpu_exited: GpuExitTracker,
    /// Pods of published processes whose NVML process has gone (`merge::LastJoined`).
    last_joined: super::merge::LastJoined,
    /// How long exited processes stay listed.
    retention: std::time::Duration,
    this_pod: Option<ThisPod>,
}

impl Collector {
    /// Opens the device source (never fails: an unavailable source is reported, not fatal)
    /// and logs which one is used and why, as every command's first log line does.
    pub fn open(source: DeviceSource, collect: Option<CollectSettings>) -> Self {
        let (nvml, backend) = match source {
            DeviceSource::Backend(backend) => {
                let name = source_name(backend.kind());
                tracing::info!(
                    "devices: {name} ({} device(s)), chosen with --backend",
                    backend.device_count()
                );
                (None, Some((backend, name)))
            }
            DeviceSource::Nvml {
                library,
                cuda_fallback,
            } => open_nvml(library, cuda_fallback),
            DeviceSource::NvmlFixture(path) => (Some(NvmlState::fixture(path)), None),
        };
        let proc_root = PathBuf::from("/proc");
        Collector {
            nvml,
            backend,
            selection: None,
            pids: PidMapper::new(),
            exited: collect.as_ref().map(|c| {
                super::exited::ExitedTracker::new(c.dir.clone(), super::exited::DEFAULT_RETENTION)
            }),
            collect_dir: collect.map(CollectDir::new),
            gpu_exited: GpuExitTracker::new(
                super::exited::DEFAULT_RETENTION,
                Some(proc_root.clone()),
            ),
            proc_root,
            last_joined: super::merge::LastJoined::default(),
            attributor: None,
            retention: super::exited::DEFAULT_RETENTION,
            this_pod: None,
        }
    }

    /// Looks pids up under `root`: the host's `/proc` (mounted elsewhere, or a test's tree),
    /// so NVML's host pids are read as they are.
    pub fn use_proc_root(&mut self, root: impl Into<PathBuf>) {
        self.proc_root = root.into();
        self.pids = PidMapper::with_proc_root(&self.proc_root, true);
        self.gpu_exited = GpuExitTracker::new(self.retention, Some(self.proc_root.clone()));
    }

    /// Names each GPU process's pod from its cgroup and `directory`'s pod list.
    pub fn attribute_pods(&mut self, directory: PodDirectory) {
        self.attributor = Some(PodAttributor::new(&self.proc_root, directory));
    }

    /// The pod this gpumem runs in (the downward API), for the page, the API and the records.
    pub fn set_this_pod(&mut self, pod: ThisPod) {
        self.this_pod = Some(pod);
    }

    /// How long a process that stopped publishing stays listed as exited (default 15 min).
    pub fn keep_exited_for(&mut self, retention: std::time::Duration) {
        self.retention = retention;
        self.gpu_exited = GpuExitTracker::new(retention, Some(self.proc_root.clone()));
        if let Some(collect_dir) = &self.collect_dir {
            let dir = collect_dir.settings().dir.clone();
            self.exited = Some(super::exited::ExitedTracker::new(dir, retention));
        }
    }

    /// How many devices the device source has, when one works.
    pub fn device_count(&self) -> Option<usize> {
        if let Some(count) = self.nvml.as_ref().and_then(NvmlState::device_count) {
            return Some(count);
        }
        self.backend.as_ref().map(|(b, _)| b.device_count())
    }

    /// Reports only these device indices (already checked against [`device_count`](Self::device_count)).
    pub fn select_devices(&mut self, indices: Vec<usize>) {
        self.selection = Some(indices);
    }

    /// NVML's compute processes, named and mapped to this namespace's pids where possible,
    /// and (the node agent) attributed to their pods.
    fn gpu_processes(&mut self, reading: &NvmlReading) -> Vec<GpuProcess> {
        let mut processes: Vec<GpuProcess> = Vec::new();
        for device in &reading.devices {
            let Ok(list) = &device.processes else {
                continue;
            };
            for p in list {
                let mapping = self.pids.map(p.pid, p.name.as_deref());
                let nvml_name = p.name.as_deref().and_then(|n| {
                    std::path::Path::new(n.trim())
                        .file_name()
                        .map(|b| b.to_string_lossy().into_owned())
                });
                let process = gpumem_wire::process::clean_process_name(
                    mapping
                        .as_ref()
                        .map(|m| m.process.as_str())
                        .or(nvml_name.as_deref())
                        .unwrap_or(""),
                );
                let pid = mapping.as_ref().map_or(p.pid, |m| m.pid);
                // Only a pid this collector could map is read under its proc root.
                let (pod, pid_namespace) = match &mapping {
                    Some(_) => (
                        self.attributor
                            .as_mut()
                            .and_then(|a| a.attribute(p.pid).pod),
                        crate::pods::attribute::pid_namespace(&self.proc_root, p.pid),
                    ),
                    None => (None, None),
                };
                // One entry per (gpu, host pid): NVML may list a process once per MIG instance.
                // (Not per translated pid: every pod's engine may be pid 1.)
                if let Some(known) = processes
                    .iter_mut()
                    .find(|k| k.gpu == device.index && k.nvml_pid == p.pid)
                {
                    known.used_bytes = match (known.used_bytes, p.used_bytes) {
                        (Some(a), Some(b)) => Some(a.saturating_add(b)),
                        (a, b) => a.or(b),
                    };
                    continue;
                }
                processes.push(GpuProcess {
                    gpu: device.index,
                    uuid: device.uuid.clone(),
                    pid,
                    nvml_pid: p.pid,
                    mapped: mapping.is_some(),
                    process,
                    used_bytes: p.used_bytes,
                    pod,
                    pid_namespace,
                    published: false,
                });
            }
        }
        super::merge::distinct_pids(&mut processes);
        processes
    }
}

impl SnapshotSource for Collector {
    fn capture(&mut self, settings: &CaptureSettings) -> Snapshot {
        let started = Instant::now();
        let timestamp_seconds = unix_now();
        let mut sources = Vec::new();
        let mut problems = Vec::new();
        if let Some(attributor) = &mut self.attributor {
            attributor.begin();
        }
        let reading = self.read_nvml(&mut sources);
        let (devices, mut gpu_processes, mut backend) = match &reading {
            Some(reading) => (
                reading
                    .devices
                    .iter()
                    .map(|d| nvml_device(d, settings))
                    .collect(),
                self.gpu_processes(reading),
                "nvml",
            ),
            None => match &self.backend {
                Some((_, name)) => (self.read_backend(settings, &mut sources), Vec::new(), *name),
                None => (Vec::new(), Vec::new(), "none"),
            },
        };
        let mut processes = Vec::new();
        let mut exited = Vec::new();
        let mut collect = None;
        if let Some(collect_dir) = &mut self.collect_dir {
            let collected = collect_dir.scan();
            sources.push(status(
                "collect",
                collected.status.readable,
                collected.problem.clone(),
            ));
            problems.extend(collected.problem);
            processes = collected.processes;
            for process in &mut processes {
                bound_tags(process, settings.tags_listed);
            }
            super::merge::merge(&mut gpu_processes, &mut processes);
            self.last_joined.fill(&mut processes);
            if let Some(tracker) = &mut self.exited {
                exited = tracker.update(&processes, timestamp_seconds);
            }
            collect = Some(collected.status);
        }
        let exited_gpu =
            self.update_exited_gpu(reading.as_ref(), &gpu_processes, timestamp_seconds);
        let mut devices = devices;
        if reading.is_none() && self.backend.is_none() {
            // Blind to the device: the publishers' own readings stand in for it.
            devices = super::published_devices::devices(&processes, settings);
            if !devices.is_empty() {
                backend = "published";
            }
        }
        for device in &mut devices {
            add_collected(device, &processes, settings);
        }
        Snapshot {
            devices,
            problems,
            collector: Some(CollectorSnapshot {
                sources,
                gpu_processes,
                processes,
                collect,
                exited,
                exited_gpu,
                pods: self.attributor.as_ref().map(PodAttributor::status),
                this_pod: self.this_pod.clone(),
            }),
            ..gpumem::snapshot::begun(settings, started, timestamp_seconds, backend.to_string())
        }
    }
}

impl Collector {
    /// GPU processes that vanished holding memory, judged only on devices read this time.
    fn update_exited_gpu(
        &mut self,
        reading: Option<&NvmlReading>,
        processes: &[GpuProcess],
        now: f64,
    ) -> Vec<gpumem_wire::ExitedGpuProcess> {
        let read: HashSet<String> = reading
            .map(|r| {
                r.devices
                    .iter()
                    .filter(|d| d.processes.is_ok())
                    .map(|d| d.uuid.clone())
                    .collect()
            })
            .unwrap_or_default();
        let attributor = self.attributor.as_ref();
        self.gpu_exited.update(processes, &read, now, |pod| {
            let container = pod.container.as_deref()?;
            attributor?.current_container_id(&pod.uid, container)
        })
    }
}

/// Counts what the collected processes hold on `device` (joined on the UUID, else the index)
/// as the device's in-use and reserved bytes, so the page's bar and chart show them next to
/// everyone else's memory. Device memory read from another source than the processes' own (a
/// simulated device, or NVML a moment before they grew) may say less is used than they hold:
/// then used is raised to what they hold, so the bar, the pressure and the process table agree.
fn add_collected(
    device: &mut DeviceSnapshot,
    processes: &[gpumem_wire::CollectedProcess],
    settings: &CaptureSettings,
) {
    let on_device = processes
        .iter()
        .flat_map(|p| &p.devices)
        .filter(|d| d.is(device));
    let (mut reserved, mut in_use) = (0u64, 0u64);
    for published in on_device {
        let held = published
            .reserved_bytes
            .or(published.in_use_bytes)
            .unwrap_or(0);
        reserved = reserved.saturating_add(held);
        in_use = in_use.saturating_add(published.in_use_bytes.unwrap_or(held).min(held));
    }
    device.stats.pools.reserved_bytes = reserved;
    device.stats.pools.in_use_bytes = in_use;
    let Some(memory) = &mut device.memory else {
        return;
    };
    let raised = memory.used_bytes < reserved;
    if raised {
        memory.used_bytes = reserved.min(memory.total_bytes);
        memory.free_bytes = memory.total_bytes - memory.used_bytes;
    }
    memory.used_by_this_process_bytes = reserved.min(memory.used_bytes);
    memory.used_by_others_bytes = memory.used_bytes - memory.used_by_this_process_bytes;
    // A reading's own pressure (a publisher's, by its thresholds) stands unless the reading
    // had to be raised.
    if raised || device.pressure.is_none() {
        device.pressure = Some(
            settings
                .pressure
                .measure(memory.used_bytes, memory.total_bytes),
        );
    }
}

/// Keeps each collected device's largest `keep` tags and folds the rest into `other`, so the
/// `tag` label stays bounded however many tags a writer publishes.
fn bound_tags(process: &mut gpumem_wire::CollectedProcess, keep: usize) {
    for device in &mut process.devices {
        if device.tags.len() <= keep {
            continue;
        }
        let groups = gpumem_wire::published::tag_groups(&device.tags);
        device.tags = gpumem::snapshot::fold_smallest(groups, keep)
            .iter()
            .map(gpumem_wire::published::published_tag)
            .collect();
    }
}
