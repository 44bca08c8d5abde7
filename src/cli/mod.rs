//! The command line: raw flags parsed by clap, validated into settings, and dispatched to the
//! subcommands. Every failure becomes one line on stderr and an exit code (2 for bad input).

mod bench;
mod demo;
mod devices;
mod estimate;
mod flight;
mod healthcheck;
mod replay;
mod serve;

use crate::backend::{open_backend, sim, BackendChoice, OpenedBackend};
use crate::units::parse_bytes;
use clap::{Args, Parser, Subcommand};
use std::fmt;

/// An error that ends the program: a message for stderr and the exit code.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    /// Bad input from the user: exit code 2.
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: 2,
            message: message.into(),
        }
    }

    /// Something failed while running: exit code 1.
    pub fn runtime(message: impl Into<String>) -> Self {
        CliError {
            code: 1,
            message: message.into(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "gpumem",
    version,
    about = "GPU memory you can see: a caching allocator for inference engines and the exporter around it",
    long_about = "gpumem manages and observes GPU memory. Every flag can also be set through the \
                  GPUMEM_* environment variable named in its help. Without a GPU (or with \
                  --backend sim) a simulated device stands in, so every command works on a laptop."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a synthetic inference workload through a real memory manager and serve the status
    /// page, /metrics and the JSON API (the first thing to try; works without a GPU).
    Demo(demo::DemoArgs),
    /// List devices and their properties (memory, compute capability, SMs, ...).
    Devices(devices::DevicesArgs),
    /// Replay allocation traces through the allocator and report waste and speed.
    Replay(replay::ReplayArgs),
    /// Estimate a model's inference memory (weights, KV cache, activations) and which device fits it.
    Estimate(estimate::EstimateArgs),
    /// Time allocation and free (median and p99) for gpumem and the driver's allocators.
    ///
    /// Each sample times BATCH alloc + free pairs and is divided by BATCH: one pair for slow
    /// allocators, up to 64 where a pair takes well under a microsecond, so the clock's own cost
    /// does not swamp the figure. Median and p99 are per pair, over those samples.
    Bench(bench::BenchArgs),
    /// The exporter/sidecar: device and per-process memory from NVML (no CUDA context), and the
    /// snapshots engines publish into --collect-dir, on /metrics, the status page and the API.
    Serve(serve::ServeArgs),
    /// GET a URL (default: the local exporter's /healthz); exit 0 on 2xx, 1 otherwise
    /// (for container health checks).
    Healthcheck(healthcheck::HealthcheckArgs),
}

/// Flags every command shares.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Which device driver: auto (CUDA if a GPU is usable, else simulated), cuda, or sim.
    #[arg(
        long,
        env = "GPUMEM_BACKEND",
        value_enum,
        default_value = "auto",
        global = true
    )]
    pub backend: BackendChoice,

    /// Devices to use: "all" or a comma-separated list of indices such as 0,2.
    #[arg(long, env = "GPUMEM_DEVICES", default_value = "all", global = true)]
    pub devices: String,

    /// Memory manager settings (TOML; keys in docs/configuration.md). GPUMEM_<KEY> variables
    /// override the file.
    #[arg(long, env = "GPUMEM_CONFIG", value_name = "FILE", global = true)]
    pub config: Option<std::path::PathBuf>,

    /// Memory of each simulated device (e.g. 80G, 24GiB).
    #[arg(
        long,
        env = "GPUMEM_SIM_MEMORY",
        default_value = "80GiB",
        global = true
    )]
    pub sim_memory: String,

    /// Number of simulated devices.
    #[arg(long, env = "GPUMEM_SIM_DEVICES", default_value_t = 1, global = true)]
    pub sim_devices: usize,
}

/// The largest simulated device: far above any GPU, and small enough that every pool's
/// address range (twice the device, per arena) fits the simulated address space.
const MAX_SIM_MEMORY: u64 = 4 * crate::units::TIB;

impl CommonArgs {
    fn sim_config(&self) -> Result<sim::SimConfig, CliError> {
        let total = parse_bytes(&self.sim_memory)
            .map_err(|e| CliError::usage(format!("--sim-memory: {e}")))?;
        if total < crate::units::GIB {
            return Err(CliError::usage(format!(
                "--sim-memory: '{}' is too small; a simulated device needs at least 1 GiB",
                self.sim_memory
            )));
        }
        if total > MAX_SIM_MEMORY {
            return Err(CliError::usage(format!(
                "--sim-memory: '{}' is too large; a simulated device has at most 4 TiB",
                self.sim_memory
            )));
        }
        if self.sim_devices == 0 || self.sim_devices > 64 {
            return Err(CliError::usage(format!(
                "--sim-devices: {} is out of range (1 to 64)",
                self.sim_devices
            )));
        }
        let spec = sim::SimDeviceSpec {
            total_bytes: total,
            ..sim::SimDeviceSpec::default()
        };
        Ok(sim::SimConfig {
            devices: vec![spec; self.sim_devices],
            ..sim::SimConfig::default()
        })
    }

    /// Opens the backend, logging which one and why (the first log line of every command).
    pub fn open(&self) -> Result<OpenedBackend, CliError> {
        let opened = open_backend(self.backend, self.sim_config()?)
            .map_err(|e| CliError::runtime(e.to_string()))?;
        tracing::info!("{}", opened.reason);
        Ok(opened)
    }

    /// The memory manager configuration: defaults, then `--config`, then `GPUMEM_*` variables.
    /// A bad file or value is a usage error naming the key.
    pub fn memory_config(&self) -> Result<crate::manager::MemoryConfig, CliError> {
        let sources = crate::manager::ConfigSources::from_process(self.config.clone());
        crate::manager::load_config(&sources).map_err(|e| CliError::usage(e.to_string()))
    }

    /// The device indices selected by `--devices`, checked against what the backend has.
    pub fn selected_devices(&self, count: usize) -> Result<Vec<usize>, CliError> {
        parse_device_selection(&self.devices, count).map_err(CliError::usage)
    }
}

/// Parses "all" or "0,2" into indices, each of which must exist.
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
            format!("--devices: '{part}' is not a device index (use \"all\" or a list like 0,2; {existing})")
        })?;
        if index >= count {
            return Err(format!(
                "--devices: device {index} does not exist ({existing})"
            ));
        }
        if !selected.contains(&index) {
            selected.push(index);
        }
    }
    Ok(selected)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUMEM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: in a container log or a file, escape codes are
    // noise that breaks grep and log pipelines (NO_COLOR turns it off on a terminal too).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Runs the command line; returns the process exit code.
pub fn run() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // clap prints help and version to stdout with code 0, usage errors with code 2.
            let _ = error.print();
            return error.exit_code();
        }
    };
    init_logging();
    let outcome = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Devices(args) => devices::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Estimate(args) => estimate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Healthcheck(args) => healthcheck::run(args),
    };
    match outcome {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("gpumem: {}", one_line(&error.message));
            error.code
        }
    }
}

/// An error message as one bounded line, whatever it quotes (a TOML error over two lines, a
/// file name or value with a newline in it, a megabyte of garbage): control characters are
/// escaped and the line ends after 2000 characters.
fn one_line(message: &str) -> String {
    const LIMIT: usize = 2000;
    let mut line = String::with_capacity(message.len().min(LIMIT + 3));
    for c in message.chars() {
        if line.len() >= LIMIT {
            line.push('…');
            break;
        }
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_selection_accepts_all_and_lists() {
        assert_eq!(parse_device_selection("all", 3), Ok(vec![0, 1, 2]));
        assert_eq!(parse_device_selection("2, 0,2", 3), Ok(vec![2, 0]));
    }

    #[test]
    fn errors_are_printed_as_one_bounded_line() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(one_line("two\nlines\t"), "two\\nlines\\t");
        let long = one_line(&"x".repeat(10_000));
        assert!(long.chars().count() <= 2001 && long.ends_with('…'));
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
}
