//! A stand-in for NVML, for tests (`gpumem serve --test-nvml-fixture FILE`, a hidden flag) and
//! the simulated node of `gpumem demo --scenario alerts`: NVML cannot be faked below the
//! library, and per-process memory needs a GPU with processes on it. The file says what NVML
//! would: devices with their memory and compute processes (host pids and bytes), or an `error`
//! as NVML's own failure. It is read again at every sample, so a test can make a process vanish,
//! a device fill up or NVML fail by rewriting it. Nothing else reads it, and the collector says
//! in its first log line that it is not reading a real device.
//!
//! ```json
//! {"devices": [{"name": "NVIDIA H100", "uuid": "GPU-…", "total_bytes": 85899345920,
//!   "used_bytes": 34359738368,
//!   "processes": [{"pid": 4121, "used_bytes": 32212254720, "name": "python3"}]}]}
//! ```

use crate::nvml::{NvmlDevice, NvmlMemory, NvmlProcess};
use serde::Deserialize;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fixture {
    devices: Vec<FixtureDevice>,
    /// Makes the whole reading fail, as NVML does when the driver stops answering.
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureDevice {
    #[serde(default)]
    name: String,
    uuid: String,
    total_bytes: u64,
    used_bytes: u64,
    #[serde(default)]
    processes: Vec<FixtureProcess>,
    /// Makes reading this device's processes fail, as NVML can.
    #[serde(default)]
    processes_error: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureProcess {
    pid: u32,
    used_bytes: Option<u64>,
    name: Option<String>,
}

/// The devices the file describes, as NVML's reader would return them.
pub fn read(path: &Path) -> Result<Vec<NvmlDevice>, String> {
    let shown = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("test NVML fixture {shown}: {e}"))?;
    let fixture: Fixture =
        serde_json::from_str(&text).map_err(|e| format!("test NVML fixture {shown}: {e}"))?;
    if let Some(error) = fixture.error {
        return Err(format!("NVML: {error}"));
    }
    Ok(fixture
        .devices
        .into_iter()
        .enumerate()
        .map(|(index, d)| {
            let used = d.used_bytes.min(d.total_bytes);
            NvmlDevice {
                index,
                name: d.name,
                uuid: d.uuid,
                memory: Ok(NvmlMemory {
                    total: d.total_bytes,
                    free: d.total_bytes - used,
                    used,
                }),
                processes: match d.processes_error {
                    Some(error) => Err(error),
                    None => Ok(d
                        .processes
                        .into_iter()
                        .map(|p| NvmlProcess {
                            pid: p.pid,
                            used_bytes: p.used_bytes,
                            name: p.name,
                        })
                        .collect()),
                },
            }
        })
        .collect())
}

/// Checks the file once at start, so a typo is bad input and not an empty collector.
pub fn check(path: &Path) -> Result<(), String> {
    read(path).map(drop)
}
