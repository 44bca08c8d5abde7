//! NVML: device memory and per-process memory without creating a CUDA context (a context costs
//! about 500 MiB on every GPU it touches, which a collector must not take). `libnvidia-ml` is
//! loaded at run time by `nvml-wrapper`, which returns errors for a missing library or symbol;
//! on top of that every call into it runs under `catch_unwind`, so a bug in the wrapper can cost
//! a sample, never the collector.

mod pids;

pub use pids::{Mapping, PidMapper};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::ffi::OsStr;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The names tried when no library is given: the driver's soname first (what the NVIDIA
/// container runtime mounts), then the development symlink.
pub const LIBRARY_CANDIDATES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// An initialised NVML.
pub struct NvmlReader {
    nvml: Nvml,
    library: String,
    device_count: usize,
}

impl std::fmt::Debug for NvmlReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlReader")
            .field("library", &self.library)
            .field("device_count", &self.device_count)
            .finish()
    }
}

/// Device memory as NVML reports it (`total = free + used + reserved`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmlMemory {
    /// Installed memory, including what the driver reserves for itself.
    pub total: u64,
    pub free: u64,
    /// NVML's "used": excludes what the driver reserves for itself (`nvidia-smi` shows this).
    pub used: u64,
}

/// A compute process on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlProcess {
    /// As NVML reports it: the host's PID namespace.
    pub pid: u32,
    /// `None` when NVML cannot tell (no permission, vGPU guests).
    pub used_bytes: Option<u64>,
    /// From `nvmlSystemGetProcessName`, when it answers.
    pub name: Option<String>,
}

/// One device's reading; the parts fail independently.
#[derive(Clone, Debug)]
pub struct NvmlDevice {
    pub index: usize,
    pub name: String,
    pub uuid: String,
    pub memory: Result<NvmlMemory, String>,
    pub processes: Result<Vec<NvmlProcess>, String>,
}

impl NvmlReader {
    /// Loads and initialises NVML from `library`, or from [`LIBRARY_CANDIDATES`] in turn.
    /// The error is one sentence saying why NVML is unavailable.
    pub fn open(library: Option<&str>) -> Result<Self, String> {
        let candidates: Vec<&str> = match library {
            Some(path) => vec![path],
            None => LIBRARY_CANDIDATES.to_vec(),
        };
        let mut reasons = Vec::new();
        let mut only_missing = true;
        for candidate in candidates {
            match guarded(|| init(candidate)) {
                Ok(Ok(reader)) => return Ok(reader),
                Ok(Err(InitFailure { reason, missing })) => {
                    only_missing &= missing;
                    reasons.push(reason);
                }
                Err(reason) => {
                    only_missing = false;
                    reasons.push(reason);
                }
            }
        }
        let mut reason = reasons.join("; ");
        if only_missing {
            reason.push_str(
                " (no NVIDIA driver here; in a container, run it with the NVIDIA runtime and \
                 NVIDIA_DRIVER_CAPABILITIES including utility)",
            );
        }
        Err(reason)
    }

    /// The library that loaded.
    pub fn library(&self) -> &str {
        &self.library
    }

    pub fn device_count(&self) -> usize {
        self.device_count
    }

    /// Reads `devices` (NVML indices; `None` for all). An `Err` means the whole reading failed.
    pub fn read(&self, devices: Option<&[usize]>) -> Result<Vec<NvmlDevice>, String> {
        let indices: Vec<usize> = match devices {
            Some(selected) => selected.to_vec(),
            None => (0..self.device_count).collect(),
        };
        guarded(|| indices.iter().map(|&i| self.read_device(i)).collect())
    }

    fn read_device(&self, index: usize) -> NvmlDevice {
        let failed = |error: String| NvmlDevice {
            index,
            name: String::new(),
            uuid: String::new(),
            memory: Err(error.clone()),
            processes: Err(error),
        };
        let Ok(nvml_index) = u32::try_from(index) else {
            return failed(format!("device {index} is out of NVML's range"));
        };
        let device = match self.nvml.device_by_index(nvml_index) {
            Ok(device) => device,
            Err(error) => return failed(format!("device {index}: {}", describe(&error))),
        };
        let memory = device
            .memory_info()
            .map(|m| NvmlMemory {
                total: m.total,
                free: m.free,
                used: m.used,
            })
            .map_err(|e| format!("device {index}: memory: {}", describe(&e)));
        let processes = device
            .running_compute_processes()
            .map(|list| {
                list.into_iter()
                    .map(|p| NvmlProcess {
                        pid: p.pid,
                        used_bytes: match p.used_gpu_memory {
                            UsedGpuMemory::Used(bytes) => Some(bytes),
                            UsedGpuMemory::Unavailable => None,
                        },
                        // Best effort: the name only makes the label friendlier.
                        name: self.nvml.sys_process_name(p.pid, 256).ok(),
                    })
                    .collect()
            })
            .map_err(|e| format!("device {index}: processes: {}", describe(&e)));
        NvmlDevice {
            index,
            name: device.name().unwrap_or_default(),
            uuid: device.uuid().unwrap_or_default(),
            memory,
            processes,
        }
    }
}

/// Why one library did not give a working NVML; `missing` when it could not even be loaded.
struct InitFailure {
    reason: String,
    missing: bool,
}

fn init(library: &str) -> Result<NvmlReader, InitFailure> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(library))
        .init()
        .map_err(|error| match error {
            // libloading's message already starts with the library's name.
            NvmlError::LibloadingError(e) => InitFailure {
                reason: e.to_string(),
                missing: true,
            },
            other => InitFailure {
                reason: format!("{library}: {}", describe(&other)),
                missing: false,
            },
        })?;
    let count = nvml.device_count().map_err(|e| InitFailure {
        reason: format!("{library}: counting devices: {}", describe(&e)),
        missing: false,
    })?;
    Ok(NvmlReader {
        nvml,
        library: library.to_string(),
        device_count: usize::try_from(count).unwrap_or(0),
    })
}

/// A sentence for the NVML errors people actually meet.
fn describe(error: &NvmlError) -> String {
    match error {
        NvmlError::LibloadingError(e) => format!("could not be loaded ({e})"),
        NvmlError::FailedToLoadSymbol(e) => {
            format!("is not a usable NVML (a function is missing: {e})")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => other.to_string(),
    }
}

/// Runs `work`, turning a panic inside it into an error.
fn guarded<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        format!("NVML call failed unexpectedly: {message}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_that_is_not_nvml_is_an_error_not_a_panic() {
        // libm loads everywhere but has no nvmlInit_v2.
        let error = NvmlReader::open(Some("libm.so.6")).expect_err("libm is not NVML");
        assert!(error.contains("libm.so.6"), "{error}");
        let error = NvmlReader::open(Some("/nonexistent/libnvidia-ml.so.1")).expect_err("missing");
        assert!(error.contains("/nonexistent/libnvidia-ml.so.1"), "{error}");
        assert!(error.contains("no NVIDIA driver here"), "{error}");
    }

    #[test]
    fn panics_become_errors() {
        let result: Result<(), String> = guarded(|| panic!("boom"));
        assert_eq!(
            result,
            Err("NVML call failed unexpectedly: boom".to_string())
        );
    }
}
