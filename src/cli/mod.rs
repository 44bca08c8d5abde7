//! The command line: raw flags parsed by clap, validated into settings, and dispatched to the
//! subcommands. Every failure becomes one line on stderr and an exit code (2 for bad input).

mod bench;
mod demo;
mod devices;
mod estimate;
mod exporter_flags;
mod flight;
mod healthcheck;
mod pods;
mod replay;
mod serve;
mod sources;
mod sweep;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use gpumem::backend::{open_backend_or_simulate, sim, BackendChoice, OpenedBackend};
use gpumem::manager::MemoryConfig;
use gpumem::named::Named;
use gpumem::settings::{self, SettingsError};
use sources::Given;
use std::fmt;

/// An error that ends the program: a message for stderr and the exit code.
#[derive(Debug)]
pub(crate) struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    /// Bad input from the user: exit code 2.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: 2,
            message: message.into(),
        }
    }

    /// Something failed while running: exit code 1.
    pub(crate) fn runtime(message: impl Into<String>) -> Self {
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
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,

    /// How log lines on stderr are written: text, or json (one object per line).
    #[arg(
        long,
        env = "GPUMEM_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
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
    Serve(Box<serve::ServeArgs>),
    /// GET a URL (default: the local exporter's /healthz); exit 0 on 2xx, 1 otherwise
    /// (for container health checks).
    Healthcheck(healthcheck::HealthcheckArgs),
}

/// Flags every command shares.
#[derive(Args, Debug, Clone)]
pub(crate) struct CommonArgs {
    /// Which device driver: auto (CUDA if a GPU is usable, else simulated), cuda, or sim.
    #[arg(
        long,
        env = "GPUMEM_BACKEND",
        value_parser = named::<BackendChoice>(),
        default_value = "auto",
        global = true
    )]
    pub backend: BackendChoice,

    /// Devices to use: "all" or a comma-separated list of indices such as 0,2.
    #[arg(long, env = "GPUMEM_DEVICES", default_value = "all", global = true)]
    pub devices: String,

    /// Memory manager settings (TOML; keys in docs/configuration.md). `GPUMEM_<KEY>` variables
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

    /// What the simulated driver's calls cost: free (at once), or h100 (spent on the calling
    /// thread as an H100 took, per call and per physical chunk), so that `replay` and `bench`
    /// on the simulated device show what misses cost on a GPU.
    #[arg(
        long,
        env = "GPUMEM_SIM_DRIVER_COSTS",
        value_parser = named::<sim::DriverCosts>(),
        default_value = "free",
        global = true
    )]
    pub sim_driver_costs: sim::DriverCosts,

    /// Make the simulated GPU never catch up by itself: no work it was given counts as done
    /// until something waits for it, as for a host far ahead of its GPU. Every wait a miss
    /// makes for the GPU then shows (`replay` reports them as `gpu_waits`).
    #[arg(long, env = "GPUMEM_SIM_GPU_BEHIND", global = true)]
    pub sim_gpu_behind: bool,

    /// Make the simulated GPU run this many fences behind the host on every stream: the work
    /// before a fence counts as done once this many more fences are recorded on its stream, as
    /// on a GPU whose queue stays that deep, and a wait finishes it at once. Implies
    /// --sim-gpu-behind, whose GPU never catches up by itself.
    #[arg(long, env = "GPUMEM_SIM_GPU_LAG", value_name = "FENCES", global = true)]
    pub sim_gpu_lag: Option<u64>,
}

impl CommonArgs {
    pub(crate) fn sim_config(&self) -> Result<sim::SimConfig, CliError> {
        let total = settings::parse_sim_memory(&self.sim_memory)
            .map_err(|e| CliError::usage(format!("--sim-memory: {e}")))?;
        let count = settings::check_sim_devices(self.sim_devices)
            .map_err(|e| CliError::usage(format!("--sim-devices: {e}")))?;
        if self.sim_gpu_lag == Some(0) {
            return Err(CliError::usage(
                "--sim-gpu-lag: give 1 fence or more (--sim-gpu-behind alone is a GPU that never catches up)",
            ));
        }
        Ok(sim::SimConfig {
            gpu_behind: self.sim_gpu_behind || self.sim_gpu_lag.is_some(),
            gpu_lag_fences: self.sim_gpu_lag.unwrap_or(0),
            ..settings::sim_config(total, count, self.sim_driver_costs)
        })
    }

    /// Opens the backend without a word: callers check what depends on it, then
    /// [`announce`](Self::announce) it, so bad input prints its one line and nothing before.
    fn open_quietly(&self) -> Result<OpenedBackend, CliError> {
        open_backend_or_simulate(self.backend, self.sim_config()?)
            .map_err(|e| CliError::runtime(e.to_string()))
    }

    /// Logs which backend and why, once input is checked: the first log line of every command
    /// when gpumem chose (`--backend auto`); a detail when the user named the backend.
    pub(crate) fn announce(&self, opened: &OpenedBackend) {
        if self.backend == BackendChoice::Auto {
            tracing::info!("{}", opened.reason);
        } else {
            tracing::debug!("{}", opened.reason);
        }
    }

    /// Opens the backend and checks the configuration against its devices: the selection
    /// (`--devices`, else the file's `devices`, else all), a reserve or preallocation bigger
    /// than a device. Every failure is bad input (exit 2); on success the backend is announced.
    pub(crate) fn open_checked(
        &self,
        config: &MemoryConfig,
        given: &Given,
    ) -> Result<(OpenedBackend, Vec<usize>), CliError> {
        let opened = self.open_quietly()?;
        let devices = self.device_selection(config, given, opened.backend.device_count())?;
        settings::check_devices(config, opened.backend.as_ref(), &devices).map_err(
            |e| match e {
                SettingsError::Invalid(m) => CliError::usage(m),
                SettingsError::Device(m) => CliError::runtime(m),
            },
        )?;
        self.announce(&opened);
        Ok((opened, devices))
    }

    /// The memory manager configuration: `base` (the defaults, or a command's own), then
    /// `--config`, then `GPUMEM_*` variables. A bad file or value is a usage error naming the key.
    pub(crate) fn memory_config_over(&self, base: MemoryConfig) -> Result<MemoryConfig, CliError> {
        let sources = gpumem::manager::ConfigSources::from_process(self.config.clone());
        gpumem::manager::load_config_over(base, &sources)
            .map_err(|e| CliError::usage(e.to_string()))
    }

    /// [`memory_config_over`](Self::memory_config_over) the defaults.
    pub(crate) fn memory_config(&self) -> Result<MemoryConfig, CliError> {
        self.memory_config_over(MemoryConfig::default())
    }

    /// The devices to use, of `count`: `--devices` (or `GPUMEM_DEVICES`) when given, else the
    /// config file's `devices`, else all; each must exist.
    pub(crate) fn device_selection(
        &self,
        config: &MemoryConfig,
        given: &Given,
        count: usize,
    ) -> Result<Vec<usize>, CliError> {
        match &config.devices {
            Some(listed) if !given.explicit("devices") => {
                settings::parse_device_selection(&settings::join_indices(listed), count)
                    .map_err(|e| CliError::usage(format!("config: devices: {e}")))
            }
            _ => parse_device_selection(&self.devices, count).map_err(CliError::usage),
        }
    }
}

/// Parses "all" or "0,2" into indices, each of which must exist; errors name `--devices`.
pub(crate) fn parse_device_selection(text: &str, count: usize) -> Result<Vec<usize>, String> {
    settings::parse_device_selection(text, count).map_err(|e| format!("--devices: {e}"))
}

/// A flag whose values are a core enum's names ([`Named`]): help lists them, parsing is the
/// core's, so a flag, its variable and a config file accept the same words.
pub(crate) fn named<T: Named + Send + Sync + Clone>() -> impl TypedValueParser<Value = T> {
    let values = T::CHOICES.iter().map(|c| {
        let value = PossibleValue::new(c.name).aliases(c.aliases.iter().copied());
        if c.help.is_empty() {
            value
        } else {
            value.help(c.help)
        }
    });
    PossibleValuesParser::new(values).try_map(|name| T::from_name(&name))
}

/// How log lines are written (`--log-format`, `GPUMEM_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// One line of text per event.
    Text,
    /// One JSON object per line, for log pipelines (no colour codes).
    Json,
}

/// The log levels a bare `GPUMEM_LOG` directive may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// `GPUMEM_LOG` as a filter, or one line saying what is wrong with it. The filter syntax takes
/// a bare word as a module name, so `GPUMEM_LOG=verbose` would silently turn every log line
/// off: a bare word must be a level (`module=level` names a module).
fn log_filter(value: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    for directive in value.split(',').map(str::trim) {
        let bare = !directive.contains(['=', '[']);
        if directive.is_empty()
            || (bare && !LEVELS.contains(&directive.to_ascii_lowercase().as_str()))
        {
            return Err(format!(
                "{:?} is not a log filter: give a level ({}) or module=level, comma-separated \
                 (e.g. info,gpumem_observe=debug)",
                value.chars().take(100).collect::<String>(),
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(value)
        .map_err(|e| {
            format!(
                "{:?} is not a log filter: {e}",
                value.chars().take(100).collect::<String>()
            )
        })
}

/// Logging to stderr at `GPUMEM_LOG` (default `default_filter`), as text or JSON. A filter that
/// does not parse is bad input, refused before anything runs.
fn init_logging(default_filter: &str, format: LogFormat) -> Result<(), CliError> {
    use std::io::IsTerminal;
    let filter = match std::env::var("GPUMEM_LOG") {
        Ok(value) if !value.trim().is_empty() => {
            log_filter(value.trim()).map_err(|e| CliError::usage(format!("GPUMEM_LOG: {e}")))?
        }
        Ok(_) | Err(std::env::VarError::NotPresent) => {
            tracing_subscriber::EnvFilter::new(default_filter)
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(CliError::usage("GPUMEM_LOG: not UTF-8"))
        }
    };
    // Colour only for a person at a terminal: in a container log or a file, escape codes are
    // noise that breaks grep and log pipelines; NO_COLOR (any non-empty value) turns it off on
    // a terminal too.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour).try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
    Ok(())
}

/// Runs the command line; returns the process exit code.
pub(crate) fn run() -> i32 {
    let command = Cli::command();
    let set: Vec<String> = std::env::vars_os()
        .filter_map(|(key, _)| key.into_string().ok())
        .collect();
    for warning in sources::unknown_variable_warnings(&set, &sources::known_variables(&command)) {
        eprintln!("{warning}");
    }
    let parsed = command
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => {
            let args: Vec<String> = std::env::args_os()
                .map(|arg| arg.to_string_lossy().into_owned())
                .collect();
            if let Some(line) = sources::clap_error_from_variable(&error, &Cli::command(), &args) {
                eprintln!("gpumem: {}", one_line(&line));
                return 2;
            }
            // clap prints help and version to stdout with code 0, usage errors with code 2.
            let _ = error.print();
            return error.exit_code();
        }
    };
    let given = matches
        .subcommand()
        .map(|(_, sub)| Given::from_matches(sub))
        .unwrap_or_default();
    // The managers' startup lines (one per device) belong to the serving commands; replay and
    // bench make a manager per trace or case, where they would bury the results and the error.
    let logging = init_logging(
        match cli.command {
            Command::Demo(_) | Command::Serve(_) => "info",
            _ => "info,gpumem::startup=warn",
        },
        cli.log_format,
    );
    if let Err(error) = logging {
        eprintln!("gpumem: {}", one_line(&error.message));
        return error.code;
    }
    let outcome = match cli.command {
        Command::Demo(args) => demo::run(args, &given),
        Command::Devices(args) => devices::run(args, &given),
        Command::Replay(args) => replay::run(args, &given),
        Command::Estimate(args) => estimate::run(args, &given),
        Command::Bench(args) => bench::run(args, &given),
        Command::Serve(args) => serve::run(*args, &given),
        Command::Healthcheck(args) => healthcheck::run(args),
    };
    match outcome {
        Ok(()) => 0,
        Err(error) => {
            let message = sources::name_the_variable(&error.message, &Cli::command(), &matches);
            eprintln!("gpumem: {}", one_line(&message));
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
    fn errors_are_printed_as_one_bounded_line() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(one_line("two\nlines\t"), "two\\nlines\\t");
        let long = one_line(&"x".repeat(10_000));
        assert!(long.chars().count() <= 2001 && long.ends_with('…'));
    }

    #[test]
    fn log_filters_are_levels_or_module_levels() {
        for good in [
            "info",
            "WARN",
            "info,gpumem::startup=warn",
            "gpumem_observe=debug",
        ] {
            assert!(log_filter(good).is_ok(), "{good}");
        }
        for bad in [
            "verbose",
            "lots!!",
            "info,,warn",
            "gpumem=loud",
            "debug,chatty",
        ] {
            let error = log_filter(bad).err().unwrap_or_default();
            assert!(error.contains("is not a log filter"), "{bad}: {error}");
        }
    }

    #[test]
    fn device_errors_name_the_flag() {
        let err = parse_device_selection("7", 1).unwrap_err();
        assert_eq!(err, "--devices: device 7 does not exist (device 0 exists)");
    }
}
