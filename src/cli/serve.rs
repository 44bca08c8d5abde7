//! `gpumem serve`: the exporter, as a sidecar or as the node agent (`collect::Collector`). Device
//! memory and per-process memory from NVML (never a CUDA context unless `--allow-cuda-context`),
//! plus the snapshots engines publish into `--collect-dir`; as the node agent (a DaemonSet), each
//! process's pod too (`pods`). Flags are checked before anything is opened; then it serves until
//! Ctrl-C or SIGTERM, like the demo.

use super::exporter_flags::ExporterFlags;
use super::{CliError, CommonArgs, Given};
use clap::Args;
use gpumem::backend::BackendChoice;
use gpumem_observe::collect::{check_dir, CollectSettings, Collector, DeviceSource};
use gpumem_observe::exporter::{Exporter, ExporterError};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(super) struct ServeArgs {
    #[command(flatten)]
    exporter: ExporterFlags,

    /// Directory engines publish their snapshots to (docs/publish-format.md); every process's
    /// series are exported with `process` and `pid` labels.
    #[arg(long, env = "GPUMEM_COLLECT_DIR", value_name = "DIR")]
    collect_dir: Option<PathBuf>,

    /// Most series all collected processes may add to /metrics together; files beyond it are
    /// skipped, newest kept (the default suits a 128 MiB memory limit).
    #[arg(long, env = "GPUMEM_COLLECT_MAX_SERIES", value_name = "N",
          default_value_t = gpumem_observe::collect::DEFAULT_MAX_SERIES)]
    collect_max_series: u64,

    /// Most bytes of collected file content kept for all processes together (e.g. 16MiB).
    #[arg(
        long,
        env = "GPUMEM_COLLECT_MAX_BYTES",
        value_name = "SIZE",
        default_value = "16MiB"
    )]
    collect_max_bytes: String,

    /// Without NVML, read device memory through CUDA (cuMemGetInfo) instead. This creates a CUDA
    /// context on every device, about 500 MiB each, which is why it is off by default.
    /// (GPUMEM_ALLOW_CUDA_CONTEXT takes 1/0, true/false, yes/no, on/off.)
    #[arg(long, env = "GPUMEM_ALLOW_CUDA_CONTEXT", value_parser = clap::builder::BoolishValueParser::new())]
    allow_cuda_context: bool,

    /// The NVML library to load (default: libnvidia-ml.so.1, then libnvidia-ml.so).
    #[arg(long, env = "GPUMEM_NVML_LIBRARY", value_name = "PATH")]
    nvml_library: Option<String>,

    /// How long a process that stopped publishing (exited, killed, stale) stays on the page
    /// and in /api/v1/snapshot as "exited", with its last numbers (e.g. 15m, 1h).
    #[arg(
        long,
        env = "GPUMEM_EXITED_RETENTION",
        default_value = "15m",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    exited_retention: String,

    #[command(flatten)]
    flight: super::flight::FlightFlags,

    #[command(flatten)]
    pods: super::pods::PodFlags,

    #[command(flatten)]
    common: CommonArgs,
}

pub(super) fn run(args: ServeArgs, given: &Given) -> Result<(), CliError> {
    // Every flag is checked before a library is loaded or a port bound.
    let (listen, interval) = args.exporter.validate().map_err(CliError::usage)?;
    let top_tags = args.exporter.top_tags().map_err(CliError::usage)?;
    let runbook_url = args
        .exporter
        .runbook_url
        .clone()
        .unwrap_or_else(|| gpumem_observe::web::DEFAULT_RUNBOOK.to_string());
    let collect = match &args.collect_dir {
        Some(dir) => {
            check_dir(dir).map_err(|e| CliError::usage(format!("--collect-dir: {e}")))?;
            let mut settings = CollectSettings::new(dir, interval);
            // No series at all would collect files only to skip every one of them.
            if args.collect_max_series == 0 {
                return Err(CliError::usage(
                    "--collect-max-series: 0 would skip every collected file; give at least 1 \
                     (the default suits a 128 MiB limit)",
                ));
            }
            settings.max_series = args.collect_max_series;
            settings.max_bytes = gpumem::units::parse_bytes(&args.collect_max_bytes)
                .map_err(|e| CliError::usage(format!("--collect-max-bytes: {e}")))?;
            if settings.max_bytes == 0 {
                return Err(CliError::usage(
                    "--collect-max-bytes: 0 would skip every collected file; give at least the \
                     size of one (the default suits a 128 MiB limit)",
                ));
            }
            Some(settings)
        }
        None => None,
    };
    let config = args.common.memory_config()?;
    let exited_retention = gpumem::units::parse_duration(&args.exited_retention)
        .map_err(|e| CliError::usage(format!("--exited-retention: {e}")))?;
    let pods = args.pods.validate()?;
    let mut flight = args.flight.settings(None)?;
    // Engines publishing into the collect directory write their records under oom/ there.
    flight.read_dir = args.collect_dir.as_ref().map(|dir| dir.join("oom"));
    // Tests only: a file stands in for NVML, whatever the backend.
    let fixture = args.pods.test_nvml_fixture.clone();
    let source = match (fixture, args.common.backend) {
        (Some(fixture), _) => DeviceSource::NvmlFixture(fixture),
        (None, BackendChoice::Auto) => DeviceSource::Nvml {
            library: args.nvml_library.clone(),
            cuda_fallback: args.allow_cuda_context,
        },
        (None, BackendChoice::Sim) => {
            DeviceSource::Backend(args.common.open_checked(&config, given)?.0.backend)
        }
        (None, BackendChoice::Cuda) if !args.allow_cuda_context => {
            return Err(CliError::usage(
                "--backend cuda: serve reads devices through NVML; reading them through CUDA \
                 creates a context (about 500 MiB per device): add --allow-cuda-context if you mean it",
            ))
        }
        (None, BackendChoice::Cuda) => {
            DeviceSource::Backend(args.common.open_checked(&config, given)?.0.backend)
        }
    };
    if args.collect_dir.is_none() {
        tracing::info!("no --collect-dir: exporting device and per-process memory only");
    }

    let mut collector = Collector::open(source, collect);
    collector.keep_exited_for(exited_retention);
    pods.apply(&mut collector)?;
    match collector.device_count() {
        Some(count) => {
            collector.select_devices(args.common.device_selection(&config, given, count)?)
        }
        None if !args.common.devices.trim().eq_ignore_ascii_case("all") => tracing::warn!(
            "--devices {}: no device source works yet; reporting every device once one does",
            args.common.devices
        ),
        None => {}
    }

    let runtime = gpumem_observe::web::runtime::build("gpumem-serve")
        .map_err(|e| CliError::runtime(format!("could not start the runtime: {e}")))?;
    let max_connections = args.exporter.max_connections().map_err(CliError::usage)?;
    gpumem_observe::web::runtime::block_on_bounded(runtime, async move {
        let mut exporter = Exporter::builder();
        if let Some(n) = max_connections {
            exporter = exporter.max_connections(n);
        }
        let exporter = exporter
            .source(Box::new(collector))
            .listen(listen)
            .interval(interval)
            .top_tags(top_tags)
            .runbook_url(runbook_url)
            .flight(flight)
            .leak_age(config.leak_age)
            .allowed_hosts(&args.exporter.allowed_hosts)
            .pressure_thresholds(config.pressure)
            .spawn()
            .map_err(|error| match error {
                bind @ ExporterError::Bind { .. } => CliError::runtime(format!(
                    "{bind} (pick another address with --listen or GPUMEM_LISTEN)"
                )),
                other => CliError::runtime(other.to_string()),
            })?;
        // Signals are caught before the address is out (see `interrupted`).
        let interrupted = crate::demo::interrupted();
        // stdout, so scripts and tests can read the address (as `gpumem demo` does).
        println!("gpumem serve: open {}", exporter.url());
        let _ = std::io::stdout().flush();
        interrupted.await;
        tracing::info!("stopping on signal; finishing requests in flight");
        exporter.shutdown_and_wait().await;
        Ok(())
    })
}
