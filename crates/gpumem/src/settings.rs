//! The one reader of gpumem's settings — which backend, which devices, the simulated device,
//! and the manager's configuration (defaults < config file < `GPUMEM_*` variables) — and the
//! one place a configuration is checked against the devices it will run on. The command line
//! (its flags fall back to the same variables) and the C ABI (variables only) both call it.

use crate::backend::{sim, BackendChoice, DeviceBackend};
use crate::manager::MemoryConfig;
use crate::units::{parse_bytes, Bytes, GIB, TIB};
use std::fmt;

/// The largest simulated device: far above any GPU, and small enough that every pool's
/// address range (twice the device, per arena) fits the simulated address space.
pub const MAX_SIM_MEMORY: u64 = 4 * TIB;
/// The most simulated devices.
pub const MAX_SIM_DEVICES: usize = 64;

/// A setting that cannot be used, and what the user must change: bad input (the command
/// line's exit code 2), or the device could not be asked (exit code 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingsError {
    /// The value is wrong; the message names the setting (flag, variable or config key).
    Invalid(String),
    /// A device could not report its memory.
    Device(String),
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsError::Invalid(m) | SettingsError::Device(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SettingsError {}

/// The simulated device's size, from text such as `80GiB`: at least 1 GiB, at most 4 TiB.
/// Errors do not name the setting; the caller prefixes its flag or variable.
pub fn parse_sim_memory(text: &str) -> Result<u64, String> {
    let total = parse_bytes(text)?;
    if total < GIB {
        return Err(format!(
            "'{text}' is too small; a simulated device needs at least 1 GiB"
        ));
    }
    if total > MAX_SIM_MEMORY {
        return Err(format!(
            "'{text}' is too large; a simulated device has at most 4 TiB"
        ));
    }
    Ok(total)
}

/// How many simulated devices: 1 to 64.
pub fn check_sim_devices(count: usize) -> Result<usize, String> {
    if count == 0 || count > MAX_SIM_DEVICES {
        return Err(format!("{count} is out of range (1 to {MAX_SIM_DEVICES})"));
    }
    Ok(count)
}

/// The simulated devices: `count` of `total_bytes` each, whose driver calls cost `costs`.
pub fn sim_config(total_bytes: u64, count: usize, costs: sim::DriverCosts) -> sim::SimConfig {
    let spec = sim::SimDeviceSpec {
        total_bytes,
        ..sim::SimDeviceSpec::default()
    };
    sim::SimConfig {
        devices: vec![spec; count],
        driver_costs: costs,
        ..sim::SimConfig::default()
    }
}

/// Parses "all" or "0,2" into indices, each of which must exist among `count` devices.
/// Errors do not name the setting; the caller prefixes its flag, variable or key.
pub fn parse_device_selection(text: &str, count: usize) -> Result<Vec<usize>, String> {
    let existing = match count {
        0 => "no devices exist".to_string(),
        1 => "device 0 exists".to_string(),
        n => format!("devices 0 to {} exist", n - 1),
    };
    if text.trim().eq_ignore_ascii_case("all") {
        return Ok((0..count).collect());
    }
    let mut selected = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let index: usize = part.parse().map_err(|_| {
            format!("'{part}' is not a device index (use \"all\" or a list like 0,2; {existing})")
        })?;
        if index >= count {
            return Err(format!("device {index} does not exist ({existing})"));
        }
        if !selected.contains(&index) {
            selected.push(index);
        }
    }
    Ok(selected)
}

/// What a configuration asks of a device with `total` bytes that it cannot have: a pressure
/// reserve of all of it (the pressure ratio would be meaningless), or a preallocation bigger
/// than it.
pub fn check_against_device(config: &MemoryConfig, index: usize, total: u64) -> Result<(), String> {
    if let Some(reserve) = config.pressure.reserve_bytes {
        if reserve >= total {
            return Err(format!(
                "pressure.reserve: {} is not less than device {index}'s memory ({})",
                Bytes(reserve),
                Bytes(total)
            ));
        }
    }
    if config.preallocate_bytes > total {
        return Err(format!(
            "preallocate: {} is more than device {index} has ({})",
            Bytes(config.preallocate_bytes),
            Bytes(total)
        ));
    }
    Ok(())
}

/// Checks `config` against each of `devices` on `backend`: every path that opens a manager
/// from settings goes through here.
pub fn check_devices(
    config: &MemoryConfig,
    backend: &dyn DeviceBackend,
    devices: &[usize],
) -> Result<(), SettingsError> {
    for &index in devices {
        let total = backend
            .mem_info(index)
            .map(|info| info.total)
            .or_else(|_| backend.properties(index).map(|p| p.total_memory_bytes))
            .map_err(|e| SettingsError::Device(format!("device {index}: {e}")))?;
        check_against_device(config, index, total).map_err(SettingsError::Invalid)?;
    }
    Ok(())
}

/// The settings a library (the C ABI) reads from `GPUMEM_*` variables alone; the command line
/// reads the same values from flags that fall back to the same variables.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `GPUMEM_BACKEND`; `None` when unset or empty.
    pub backend: Option<BackendChoice>,
    /// `GPUMEM_DEVICES`: "all" or a list such as `0,2`, checked once the backend is open.
    pub devices: Option<String>,
    /// The simulated devices (`GPUMEM_SIM_MEMORY`, `GPUMEM_SIM_DEVICES`,
    /// `GPUMEM_SIM_DRIVER_COSTS`).
    pub sim: sim::SimConfig,
    /// The manager's configuration: `base`, then `GPUMEM_CONFIG`, then `GPUMEM_<KEY>`.
    pub memory: MemoryConfig,
}

#[cfg(feature = "config-file")]
impl Settings {
    /// Reads every setting from the process's environment over `base`; an error names the
    /// variable (or config key) that was wrong.
    pub fn from_environment(base: MemoryConfig) -> Result<Self, SettingsError> {
        Self::from_variables(|name| std::env::var(name).ok(), base)
    }

    /// [`from_environment`](Self::from_environment) with the variables `lookup` answers; the
    /// config file's keys are read from the process's environment.
    pub fn from_variables(
        lookup: impl Fn(&str) -> Option<String>,
        base: MemoryConfig,
    ) -> Result<Self, SettingsError> {
        use crate::named::Named;
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let invalid = |name: &str, why: String| SettingsError::Invalid(format!("{name}: {why}"));
        let backend = set("GPUMEM_BACKEND")
            .map(|v| BackendChoice::from_name(&v).map_err(|e| invalid("GPUMEM_BACKEND", e)))
            .transpose()?;
        let total = match set("GPUMEM_SIM_MEMORY") {
            Some(v) => parse_sim_memory(&v).map_err(|e| invalid("GPUMEM_SIM_MEMORY", e))?,
            None => 80 * GIB,
        };
        let count = match set("GPUMEM_SIM_DEVICES") {
            Some(v) => v
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("'{v}' is not a number"))
                .and_then(check_sim_devices)
                .map_err(|e| invalid("GPUMEM_SIM_DEVICES", e))?,
            None => 1,
        };
        let costs = set("GPUMEM_SIM_DRIVER_COSTS")
            .map(|v| {
                sim::DriverCosts::from_name(&v).map_err(|e| invalid("GPUMEM_SIM_DRIVER_COSTS", e))
            })
            .transpose()?
            .unwrap_or_default();
        let file = set("GPUMEM_CONFIG").map(std::path::PathBuf::from);
        let sources = crate::manager::ConfigSources::from_process(file);
        let memory = crate::manager::load_config_over(base, &sources)
            .map_err(|e| SettingsError::Invalid(e.to_string()))?;
        Ok(Settings {
            backend,
            devices: set("GPUMEM_DEVICES"),
            sim: sim_config(total, count, costs),
            memory,
        })
    }
}

impl Settings {
    /// The configuration to open a manager with on `backend`: the device selection resolved
    /// (`GPUMEM_DEVICES`, else the config file's `devices`, else all) and checked, and the
    /// configuration checked against each selected device.
    pub fn resolve(&self, backend: &dyn DeviceBackend) -> Result<MemoryConfig, SettingsError> {
        let mut config = self.memory.clone();
        let count = backend.device_count();
        let devices = match (&self.devices, &config.devices) {
            (Some(text), _) => parse_device_selection(text, count)
                .map_err(|e| SettingsError::Invalid(format!("GPUMEM_DEVICES: {e}")))?,
            (None, Some(listed)) => {
                let text = join_indices(listed);
                parse_device_selection(&text, count)
                    .map_err(|e| SettingsError::Invalid(format!("config: devices: {e}")))?
            }
            (None, None) => (0..count).collect(),
        };
        check_devices(&config, backend, &devices)?;
        if self.devices.is_some() || config.devices.is_some() {
            config.devices = Some(devices);
        }
        Ok(config)
    }
}

/// Indices as the list a user writes: `0,2`.
pub fn join_indices(indices: &[usize]) -> String {
    indices
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;

    #[test]
    fn device_selection_accepts_all_and_lists() {
        assert_eq!(parse_device_selection("all", 3), Ok(vec![0, 1, 2]));
        assert_eq!(parse_device_selection("2, 0,2", 3), Ok(vec![2, 0]));
    }

    #[test]
    fn device_selection_names_what_exists() {
        let err = parse_device_selection("7", 1).unwrap_err();
        assert!(
            err.contains("device 7 does not exist (device 0 exists)"),
            "{err}"
        );
        assert!(parse_device_selection("x", 2)
            .unwrap_err()
            .contains("not a device index"));
        assert!(parse_device_selection("-1", 2).is_err());
    }

    #[test]
    fn sim_memory_is_bounded() {
        assert_eq!(parse_sim_memory("80GiB"), Ok(80 * GIB));
        assert!(parse_sim_memory("512MiB")
            .unwrap_err()
            .contains("too small"));
        assert!(parse_sim_memory("5TiB").unwrap_err().contains("too large"));
        assert!(check_sim_devices(0).is_err() && check_sim_devices(65).is_err());
    }

    #[cfg(feature = "config-file")]
    fn from(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        use std::collections::HashMap;
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_variables(|name| vars.get(name).cloned(), MemoryConfig::default())
    }

    #[cfg(feature = "config-file")]
    #[test]
    fn variables_are_read_and_errors_name_the_variable() {
        let settings = from(&[
            ("GPUMEM_BACKEND", "sim"),
            ("GPUMEM_SIM_MEMORY", "24GiB"),
            ("GPUMEM_SIM_DEVICES", "2"),
        ])
        .unwrap();
        assert_eq!(settings.backend, Some(BackendChoice::Sim));
        assert_eq!(settings.sim.devices.len(), 2);
        assert_eq!(settings.sim.devices[0].total_bytes, 24 * GIB);
        let err = from(&[("GPUMEM_SIM_DEVICES", "many")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "GPUMEM_SIM_DEVICES: 'many' is not a number"
        );
        let err = from(&[("GPUMEM_BACKEND", "rocm")]).unwrap_err();
        assert!(
            err.to_string().starts_with("GPUMEM_BACKEND: 'rocm'"),
            "{err}"
        );
    }

    #[test]
    fn a_reserve_as_large_as_the_device_is_refused_on_every_path() {
        let backend = SimBackend::new(sim_config(80 * GIB, 2, sim::DriverCosts::Free));
        let mut memory = MemoryConfig::default();
        memory.pressure.reserve_bytes = Some(100 * GIB);
        let settings = Settings {
            backend: Some(BackendChoice::Sim),
            devices: Some("1".into()),
            sim: sim::SimConfig::default(),
            memory,
        };
        let err = settings.resolve(&backend).unwrap_err();
        assert!(
            matches!(&err, SettingsError::Invalid(m) if m.contains("pressure.reserve: 100.00 GiB is not less than device 1's memory")),
            "{err}"
        );
        let fine = Settings {
            memory: MemoryConfig::default(),
            ..settings
        };
        assert_eq!(fine.resolve(&backend).unwrap().devices, Some(vec![1]));
    }
}
