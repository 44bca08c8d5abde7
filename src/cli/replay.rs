//! `gpumem replay`: traces through a real `MemoryManager` (or the driver's own pool, the
//! baseline), one report per trace, an optional plot, and a sweep over the cache settings.

use super::sweep::Sweep;
use super::{CliError, CommonArgs, Given};
use crate::plot::{line_chart_svg, Series};
use clap::Args;
use gpumem::backend::timed::TimedBackend;
use gpumem::manager::{MemoryConfig, MemoryManager, Strategy};
use gpumem::safe_fs::{check_target, write_atomically, WriteOptions};
use gpumem::units::Bytes;
use gpumem_replay::replay::{
    replay_config, replay_driver_pool, replay_logging_misses, replay_timing_driver, MissRecord,
    ReplayReport, TimelinePoint,
};
use gpumem_replay::trace::{load_trace, Trace};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub(super) struct ReplayArgs {
    /// Trace files (gzip or plain text; format in the traces README).
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,

    /// Print one JSON object per trace (one per line) instead of a table.
    #[arg(long, env = "GPUMEM_JSON")]
    json: bool,

    /// pooled (the caching allocator), direct (every request to the driver) or driver-pool
    /// (the driver's stream-ordered pool, cuMemAllocAsync with release threshold max; CUDA only).
    #[arg(long, env = "GPUMEM_STRATEGY", value_enum, default_value = "pooled")]
    strategy: ReplayStrategy,

    /// Replay each trace once per cache setting (largest chunk, with 2 and 6 MiB also cut whole
    /// when growing and 6, 32 and 128 MiB also placing blocks on mapped pages first, x idle
    /// pages kept x idle per mille: ninety settings; --repeat N alternates N rounds and reports
    /// medians) and print waste against time per operation, so you can pick your point; rows
    /// marked * are on the frontier (no other setting is both less wasteful and faster). On the
    /// CUDA backend the driver's own pool is replayed in every round too, and the setting that
    /// beats it on both axes is named with the variables that select it (one faster than the
    /// pool in every round before one faster at the median only, then the least memory), and
    /// beside it the fastest setting within the pool's memory, whose lead on time is the widest;
    /// with several traces, a last line names the one setting that beats it on the most of
    /// them. Ignores --idle-pages and --idle-per-mille.
    #[arg(long, env = "GPUMEM_SWEEP")]
    sweep: bool,

    /// Replay the CUDA driver's own pool in the same rounds as the allocator at the setting
    /// given (--repeat N alternates N rounds: drift on a busy host falls on both) and print
    /// both medians with the verdict, as --sweep does for one setting. CUDA only
    #[arg(long, env = "GPUMEM_AGAINST_DRIVER_POOL")]
    against_driver_pool: bool,

    /// Draw requested, in-use and reserved bytes over each trace into this SVG file
    /// (with several traces, the trace name is added before the extension).
    #[arg(long, env = "GPUMEM_PLOT", value_name = "FILE.svg")]
    plot: Option<PathBuf>,

    /// Write one JSON line per miss into this file: the trace, which allocation, its size, the
    /// address it got, pages mapped again and created for it, chunks unmapped to make room,
    /// bytes in use and reserved after it. Shows which requests miss and why; reading the
    /// statistics around every allocation slows the replay, so compare ns/op only between runs
    /// that both log or both do not. Pooled strategy only.
    #[arg(long, env = "GPUMEM_MISSES", value_name = "FILE.jsonl")]
    misses: Option<PathBuf>,

    /// Replay each trace this many times and report the replay with the median time per
    /// operation (JSON adds every replay's figure as ns_per_op_runs). One replay's ns/op can
    /// move by tens of percent on a GPU host; compare medians of a few.
    #[arg(long, env = "GPUMEM_REPEAT", default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,

    /// Device to replay on.
    #[arg(long, env = "GPUMEM_DEVICE", default_value_t = 0)]
    device: usize,

    /// Idle pages each pool keeps mapped for reuse, at least.
    #[arg(long, env = "GPUMEM_IDLE_PAGES", default_value_t = MemoryConfig::default().idle_pages_kept)]
    idle_pages: usize,

    /// Idle pages kept per 1024 mapped pages, when that is more than --idle-pages.
    #[arg(long, env = "GPUMEM_IDLE_PER_MILLE", default_value_t = MemoryConfig::default().idle_per_mille)]
    idle_per_mille: usize,

    #[command(flatten)]
    common: CommonArgs,
}

/// What `--strategy` picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ReplayStrategy {
    Pooled,
    Direct,
    DriverPool,
}

pub(super) fn run(args: ReplayArgs, given: &Given) -> Result<(), CliError> {
    // Read every trace before replaying any, so a bad file fails fast and prints nothing else.
    let traces = args
        .traces
        .iter()
        .map(|path| load_trace(path).map_err(|e| CliError::usage(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = &args.misses {
        if args.sweep || args.against_driver_pool || args.strategy != ReplayStrategy::Pooled {
            return Err(CliError::usage(
                "--misses logs the pooled allocator's misses: leave out --sweep, \
                 --against-driver-pool and --strategy",
            ));
        }
        check_output_path("--misses", path, "misses.jsonl")?;
        check_target(path, &args.traces).map_err(|e| CliError::usage(format!("--misses: {e}")))?;
    }
    let names: Vec<&str> = traces.iter().map(|t| t.name.as_str()).collect();
    let plots = args.plot.as_deref().map(|plot| plot_paths(plot, &names));
    if let (Some(plot), Some(paths)) = (&args.plot, &plots) {
        check_output_path("--plot", plot, "replay.svg")?;
        for path in paths {
            let path = path.clone();
            check_target(&path, &args.traces)
                .map_err(|e| CliError::usage(format!("--plot: {e}")))?;
            if args.misses.as_ref() == Some(&path) {
                return Err(CliError::usage(format!(
                    "--misses and --plot both name {}: give each its own file",
                    path.display()
                )));
            }
        }
    }
    if args.repeat > 1 && args.misses.is_some() {
        return Err(CliError::usage(
            "--repeat times plain replays: leave it out with --misses",
        ));
    }
    if args.sweep && args.strategy != ReplayStrategy::Pooled {
        return Err(CliError::usage(
            "--sweep varies the pooled strategy's cache settings; leave out --strategy",
        ));
    }
    if args.plot.is_some() && (args.sweep || args.against_driver_pool) {
        return Err(CliError::usage(
            "--plot draws one replay per trace: leave out --sweep and --against-driver-pool, \
             which replay each trace under several allocators",
        ));
    }
    if args.against_driver_pool && (args.sweep || args.strategy != ReplayStrategy::Pooled) {
        return Err(CliError::usage(
            "--against-driver-pool compares the pooled allocator with the driver pool; leave \
             out --sweep (which does it for every setting) and --strategy",
        ));
    }
    // Defaults < --config < GPUMEM_* < flags given: a flag's default never hides the file.
    let mut base = args.common.memory_config()?;
    if given.explicit("strategy") {
        base.strategy = match args.strategy {
            ReplayStrategy::Direct => Strategy::Direct,
            ReplayStrategy::Pooled | ReplayStrategy::DriverPool => Strategy::Pooled,
        };
    }
    if given.explicit("idle_pages") {
        base.idle_pages_kept = args.idle_pages;
    }
    if given.explicit("idle_per_mille") {
        base.idle_per_mille = args.idle_per_mille;
    }
    let (opened, _) = args.common.open_checked(&base, given)?;
    let backend = opened.backend;
    let device = args.device;
    if device >= backend.device_count() {
        return Err(CliError::usage(format!(
            "--device: device {device} does not exist ({} device(s) present)",
            backend.device_count()
        )));
    }
    // Every trace gets a fresh manager with this configuration, checked before anything is
    // printed: a bad --idle-per-mille is bad input (exit 2), not a failure half-way.
    // The driver's own pool is a capability of the CUDA backend (cuMemAllocAsync).
    let has_driver_pool = backend.driver_pool().is_some();
    let driver_pool = match args.strategy {
        ReplayStrategy::Pooled if args.against_driver_pool && !has_driver_pool => {
            return Err(CliError::usage(
                "--against-driver-pool needs the CUDA backend (cuMemAllocAsync); the simulated device has no driver pool",
            ));
        }
        ReplayStrategy::Pooled if args.against_driver_pool => Some(&*backend),
        // A sweep on the driver compares every setting with the driver's own pool.
        ReplayStrategy::Pooled if args.sweep && has_driver_pool => Some(&*backend),
        ReplayStrategy::DriverPool if !has_driver_pool => {
            return Err(CliError::usage(
                "--strategy driver-pool needs the CUDA backend (cuMemAllocAsync); the simulated device has no driver pool",
            ));
        }
        ReplayStrategy::DriverPool => Some(&*backend),
        _ => None,
    };
    let config = replay_config(base, device);
    config.validate().map_err(|e| match e.key.as_str() {
        "idle_per_mille" => CliError::usage(format!("--idle-per-mille: {}", e.message)),
        _ => CliError::usage(e.to_string()),
    })?;
    // A request larger than the whole device cannot be served by any strategy: that is bad
    // input, said before the table's first line rather than as a failure half-way through it.
    let total = backend
        .properties(device)
        .map_err(|e| CliError::runtime(e.to_string()))?
        .total_memory_bytes;
    for (trace, path) in traces.iter().zip(&args.traces) {
        let largest = trace
            .events
            .iter()
            .filter_map(|event| match event {
                gpumem_replay::trace::TraceEvent::Alloc { size, .. } => Some(*size),
                gpumem_replay::trace::TraceEvent::Free { .. } => None,
            })
            .max();
        if let Some(largest) = largest.filter(|&size| size > total) {
            return Err(CliError::usage(format!(
                "{}: an allocation of {} can never fit on device {device}, which has {} in total",
                path.display(),
                Bytes(largest),
                Bytes(total)
            )));
        }
    }
    if args.sweep || args.against_driver_pool {
        let sweep = Sweep {
            backend: &backend,
            device,
            base: &config,
            grid: args.sweep,
            repeat: args.repeat,
            driver_pool,
            json: args.json,
        };
        return sweep.run(&traces);
    }
    if !args.json {
        println!(
            "{:<20} {:>9} {:>14} {:>14} {:>9} {:>14} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9}",
            "TRACE",
            "EVENTS",
            "PEAK REQUESTED",
            "PEAK RESERVED",
            "RES/PEAK",
            "DRIVER A/F",
            "HITS",
            "NS/OP",
            "IN DRIVER",
            "MISSES",
            "MISS P50",
            "MISS P99"
        );
    }
    let mut misses = args.misses.as_ref().map(|_| Vec::new());
    for (index, trace) in traces.iter().enumerate() {
        let mut runs = Vec::with_capacity(args.repeat as usize);
        for run in 1..=args.repeat {
            let label = match args.repeat {
                1 => trace.name.clone(),
                n => format!("{} ({run}/{n})", trace.name),
            };
            let bar = progress_bar(trace.events.len() as u64, &label);
            let progress = |done| bar.set_position(done);
            let replayed = match &driver_pool {
                Some(pool) => replay_driver_pool(*pool, device, trace, progress),
                None => replay_fresh(&backend, device, &config, trace, progress, misses.as_mut())?,
            }
            .map_err(|e| CliError::runtime(e.to_string()))?;
            bar.finish_and_clear();
            runs.push(replayed);
        }
        let (report, timeline) = median_run(runs);
        print_report(&report, args.json)?;
        if let Some(path) = plots.as_ref().and_then(|paths| paths.get(index)) {
            write_plot(path, &report, &timeline, &args.traces)?;
        }
    }
    if args.repeat > 1 && !args.json {
        println!(
            "NS/OP and every other column: the replay with the median ns/op of {} per trace",
            args.repeat
        );
    }
    if let (Some(path), Some(misses)) = (&args.misses, misses) {
        write_misses(path, &misses, &args.traces)?;
    }
    Ok(())
}

/// The replay with the median ns/op (the lower middle one of an even count), carrying every
/// replay's ns/op when there were several.
pub(super) fn median_run(
    mut runs: Vec<(ReplayReport, Vec<TimelinePoint>)>,
) -> (ReplayReport, Vec<TimelinePoint>) {
    let in_order: Vec<f64> = runs.iter().map(|(report, _)| report.ns_per_op).collect();
    runs.sort_by(|a, b| a.0.ns_per_op.total_cmp(&b.0.ns_per_op));
    let (mut report, timeline) = runs.swap_remove((runs.len() - 1) / 2);
    if in_order.len() > 1 {
        report.ns_per_op_runs = in_order;
    }
    (report, timeline)
}

fn write_misses(path: &Path, misses: &[MissRecord], inputs: &[PathBuf]) -> Result<(), CliError> {
    let mut lines = String::new();
    for miss in misses {
        lines += &serde_json::to_string(miss).map_err(|e| CliError::runtime(e.to_string()))?;
        lines.push('\n');
    }
    let options = WriteOptions {
        inputs: inputs.to_vec(),
        durable: true,
    };
    write_atomically(path, lines.as_bytes(), &options)
        .map_err(|e| CliError::runtime(format!("could not write {}: {e}", path.display())))?;
    eprintln!("wrote {} misses to {}", misses.len(), path.display());
    Ok(())
}

/// A fresh manager per trace: nothing cached from the previous one skews the next.
pub(super) fn replay_fresh(
    backend: &std::sync::Arc<dyn gpumem::backend::DeviceBackend>,
    device: usize,
    config: &MemoryConfig,
    trace: &Trace,
    progress: impl FnMut(u64),
    misses: Option<&mut Vec<MissRecord>>,
) -> Result<Result<(ReplayReport, Vec<TimelinePoint>), gpumem_replay::replay::ReplayError>, CliError>
{
    // The pools reach the driver through a backend that times its calls (a few tens of
    // nanoseconds a call, and only misses call it), so the report can split the time per
    // operation between the driver and the allocator.
    let timed = std::sync::Arc::new(TimedBackend::new(backend.clone()));
    let manager = MemoryManager::new(timed.clone(), config.clone())
        .map_err(|e| CliError::runtime(e.to_string()))?;
    Ok(match misses {
        Some(log) => replay_logging_misses(&manager, device, trace, progress, log),
        None => replay_timing_driver(&manager, &timed, device, trace, progress),
    })
}

/// Nanoseconds as microseconds for the tables ("-" when there were none).
pub(super) fn micros(ns: u64) -> String {
    if ns == 0 {
        "-".to_string()
    } else {
        format!("{:.1}µs", ns as f64 / 1000.0)
    }
}

pub(super) fn progress_bar(len: u64, name: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    // Hidden automatically when stderr is not a terminal (CI logs, pipes).
    bar.set_style(
        ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len} events ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(name.to_string());
    bar
}

pub(super) fn print_report(report: &ReplayReport, json: bool) -> Result<(), CliError> {
    if json {
        let line = serde_json::to_string(report)
            .map_err(|e| CliError::runtime(format!("could not encode JSON: {e}")))?;
        println!("{line}");
    } else {
        println!(
            "{:<20} {:>9} {:>14} {:>14} {:>9.3} {:>14} {:>6.1}% {:>9.0} {:>9} {:>7} {:>9} {:>9}",
            report.trace,
            report.events,
            Bytes(report.peak_requested_bytes).to_string(),
            Bytes(report.peak_reserved_bytes).to_string(),
            report.reserved_over_peak,
            format!("{}/{}", report.driver_allocs, report.driver_frees),
            report.pool_hit_ratio * 100.0,
            report.ns_per_op,
            report
                .driver_ns_per_op
                .map_or("–".to_string(), |ns| format!("{ns:.0}")),
            report.misses,
            micros(report.miss_p50_ns),
            micros(report.miss_p99_ns)
        );
    }
    Ok(())
}

/// A file `flag` will write: its directory exists and it is not one itself.
fn check_output_path(flag: &str, path: &Path, example: &str) -> Result<(), CliError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(CliError::usage(format!(
            "{flag}: directory {} does not exist",
            parent.display()
        )));
    }
    if path.is_dir() {
        return Err(CliError::usage(format!(
            "{flag}: {} is a directory; give a file name such as {example}",
            path.display()
        )));
    }
    Ok(())
}

/// The chart of each trace: `plot` itself for one trace; for several, `STEM-NAME.EXT` beside it,
/// a trace whose name came before (`a/x.trace` and `b/x.trace`, or one trace given twice) getting
/// `-2`, `-3`, … so that no chart overwrites another.
fn plot_paths(plot: &Path, traces: &[&str]) -> Vec<PathBuf> {
    if traces.len() <= 1 {
        return vec![plot.to_path_buf(); traces.len()];
    }
    let stem = plot
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("replay");
    let ext = plot.extension().and_then(|s| s.to_str()).unwrap_or("svg");
    let mut taken = std::collections::HashSet::new();
    traces
        .iter()
        .map(|name| {
            let mut unique = name.to_string();
            let mut n = 2;
            while !taken.insert(unique.clone()) {
                unique = format!("{name}-{n}");
                n += 1;
            }
            plot.with_file_name(format!("{stem}-{unique}.{ext}"))
        })
        .collect()
}

fn write_plot(
    path: &Path,
    report: &ReplayReport,
    timeline: &[TimelinePoint],
    inputs: &[PathBuf],
) -> Result<(), CliError> {
    // Each bucket draws its low, its high and where it ended, so the plotted peaks are the
    // printed ones (the plot's own downsampling keeps each bucket's extremes as well).
    let series_of = |pick: fn(&TimelinePoint) -> [u64; 3]| -> Vec<(f64, f64)> {
        timeline
            .iter()
            .flat_map(|p| pick(p).map(|v| (p.event as f64, v as f64)))
            .collect()
    };
    let requested = series_of(|p| [p.requested_low, p.requested_high, p.requested]);
    let in_use = series_of(|p| [p.in_use.min(p.in_use_high), p.in_use_high, p.in_use]);
    let reserved = series_of(|p| [p.reserved.min(p.reserved_high), p.reserved_high, p.reserved]);
    let title = format!(
        "{}: reserved/peak {:.3} ({} strategy, {} backend)",
        report.trace, report.reserved_over_peak, report.strategy, report.backend
    );
    let svg = line_chart_svg(
        &title,
        "event",
        "bytes",
        &[
            Series {
                label: "requested",
                color: "#2a7ab9",
                points: &requested,
            },
            Series {
                label: "in use (blocks)",
                color: "#e08a1e",
                points: &in_use,
            },
            Series {
                label: "reserved from driver",
                color: "#c0392b",
                points: &reserved,
            },
        ],
    );
    let options = WriteOptions {
        inputs: inputs.to_vec(),
        durable: true,
    };
    write_atomically(path, svg.as_bytes(), &options)
        .map_err(|e| CliError::runtime(format!("could not write {}: {e}", path.display())))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
