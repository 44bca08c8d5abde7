//! `gpumem demo`: flags for the demo, validated into `DemoSettings`, then `gpumem::demo::run`.

use super::exporter_flags::ExporterFlags;
use super::{CliError, CommonArgs, Given};
use crate::demo::{self, DemoError, DemoSettings, Scenario};
use clap::Args;
use gpumem::backend::sim::SimBackend;
use gpumem::backend::{BackendKind, DeviceBackend};
use gpumem::manager::MemoryConfig;
use gpumem::units::parse_duration;
use gpumem_observe::exporter::ExporterError;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub(super) struct DemoArgs {
    #[command(flatten)]
    exporter: ExporterFlags,

    /// Stop after this long (e.g. 30s, 10m); without it the demo runs until Ctrl-C or SIGTERM.
    // A value starting with '-' is taken as one, so `-3s` gets a message about durations
    // rather than clap's "unexpected argument '-3'".
    #[arg(long, env = "GPUMEM_DURATION", allow_hyphen_values = true)]
    duration: Option<String>,

    /// Live allocations older than this are leak suspects (short here, so the leak view fills
    /// within a minute).
    #[arg(long, env = "GPUMEM_LEAK_AGE", default_value = DEMO_LEAK_AGE, allow_hyphen_values = true)]
    leak_age: String,

    /// Push every device to critical pressure this long after the start, for 45 s (e.g. 20s);
    /// `POST /api/v1/demo/pressure-spike?seconds=N` does the same at any time.
    #[arg(long, env = "GPUMEM_SPIKE_AT", allow_hyphen_values = true)]
    spike_at: Option<String>,

    /// What the demo shows: calm (pressure on a slow wave, a small leak that stops; nothing
    /// pages anyone) or alerts (an hour that repeats, in which every alert of
    /// grafana/alerts.yml fires within 35 minutes: pressure up to critical, refused requests, a
    /// growing leak, a fragmented pool, a failing sampler; and a node agent served on the next
    /// port, whose NVML fails, which goes away for 4 minutes, and which names the simulated
    /// device's processes by pod). alerts needs the simulated device. See docs/demo.md.
    #[arg(
        long,
        env = "GPUMEM_SCENARIO",
        default_value = "calm",
        value_name = "NAME"
    )]
    scenario: String,

    /// Also publish snapshots into this directory (created if missing) every interval, for a
    /// sidecar to collect with `gpumem serve --collect-dir DIR`.
    #[arg(long, env = "GPUMEM_PUBLISH_DIR", value_name = "DIR")]
    publish_dir: Option<std::path::PathBuf>,

    #[command(flatten)]
    flight: super::flight::FlightFlags,

    #[command(flatten)]
    common: CommonArgs,
}

/// The demo's own default leak age (a config file's `leak_age` overrides it).
const DEMO_LEAK_AGE: &str = "30s";

fn flag_duration(flag: &str, text: &str) -> Result<Duration, CliError> {
    parse_duration(text).map_err(|e| CliError::usage(format!("{flag}: {e}")))
}

pub(super) fn run(args: DemoArgs, given: &Given) -> Result<(), CliError> {
    // Every flag is checked before the driver is touched: bad input costs nothing.
    let (listen, interval) = args.exporter.validate().map_err(CliError::usage)?;
    let duration = match &args.duration {
        // A demo that stops before it starts is a mistake (leave the flag out to run for good).
        Some(text) => match flag_duration("--duration", text)? {
            zero if zero.is_zero() => {
                return Err(CliError::usage(format!(
                    "--duration: '{text}' would stop the demo at once; give a positive duration, \
                     or leave --duration out to run until Ctrl-C"
                )))
            }
            positive => Some(positive),
        },
        None => None,
    };
    let top_tags = args.exporter.top_tags().map_err(CliError::usage)?;
    let scenario = Scenario::parse(args.scenario.trim()).ok_or_else(|| {
        CliError::usage(format!(
            "--scenario: '{}' is not a scenario; give one of {}",
            args.scenario,
            Scenario::NAMES.join(", ")
        ))
    })?;
    let spike_at = match &args.spike_at {
        Some(_) if scenario == Scenario::Alerts => {
            return Err(CliError::usage(
                "--spike-at: the alerts scenario moves pressure itself; leave --spike-at out \
                 or use --scenario calm",
            ))
        }
        Some(text) => Some(flag_duration("--spike-at", text)?),
        None => None,
    };
    // Defaults (the demo's short leak age) < --config < GPUMEM_* < flags given.
    let flag_leak_age = match given.explicit("leak_age") {
        true => Some(flag_duration("--leak-age", &args.leak_age)?),
        false => None,
    };
    let base = MemoryConfig {
        leak_age: flag_duration("--leak-age", DEMO_LEAK_AGE)?,
        ..MemoryConfig::default()
    };
    let mut memory = args.common.memory_config_over(base)?;
    if let Some(leak_age) = flag_leak_age {
        memory.leak_age = leak_age;
        memory.validate().map_err(|e| match e.key.as_str() {
            "leak_age" => CliError::usage(format!("--leak-age: {}", e.message)),
            _ => CliError::usage(e.to_string()),
        })?;
    }
    let leak_age = memory.leak_age;
    let flight = args
        .flight
        .settings(args.publish_dir.as_ref().map(|dir| dir.join("oom")))?;

    // An address that cannot be bound fails here, before a device is opened or a line logged
    // (the exporter binds it again once the managers exist).
    std::net::TcpListener::bind(listen).map_err(|source| {
        bind_error(ExporterError::Bind {
            addr: listen,
            source,
        })
    })?;
    let (opened, devices) = args.common.open_checked(&memory, given)?;
    let (backend, sim): (Arc<dyn DeviceBackend>, _) = match opened.backend.kind() {
        // Its pressure, refusals and failures are the simulated device's.
        BackendKind::Cuda if scenario == Scenario::Alerts => {
            return Err(CliError::usage(
                "--scenario alerts: needs the simulated device, and this one is a GPU; add \
                 --backend sim",
            ))
        }
        BackendKind::Cuda => (opened.backend, None),
        BackendKind::Sim => {
            // The demo changes what "other processes" hold, which needs the concrete simulated
            // backend; the opened one is behind `dyn`, so build the same one again.
            let sim = Arc::new(SimBackend::new(args.common.sim_config()?));
            (Arc::clone(&sim) as Arc<dyn DeviceBackend>, Some(sim))
        }
    };
    let settings = DemoSettings {
        devices: Some(devices),
        listen,
        interval,
        duration,
        leak_age,
        spike_at,
        publish_dir: args.publish_dir,
        top_tags,
        runbook_url: args.exporter.runbook_url.clone(),
        flight,
        memory,
        allowed_hosts: args.exporter.allowed_hosts.clone(),
        max_connections: args.exporter.max_connections().map_err(CliError::usage)?,
        scenario,
    };
    demo::run(backend, sim, settings).map_err(|error| match error {
        DemoError::Exporter(bind @ ExporterError::Bind { .. }) => bind_error(bind),
        DemoError::Publish(publish) => CliError::usage(format!("--publish-dir: {publish}")),
        other => CliError::runtime(other.to_string()),
    })
}

fn bind_error(bind: ExporterError) -> CliError {
    CliError::runtime(format!(
        "{bind} (pick another address with --listen or GPUMEM_LISTEN)"
    ))
}
