//! `gpumem replay`: traces through a real `MemoryManager`, one report per trace, an optional plot.

use super::{CliError, CommonArgs};
use crate::manager::{MemoryConfig, MemoryManager, Strategy};
use crate::plot::{line_chart_svg, write_file_atomically, Series};
use crate::replay::{replay, ReplayReport, TimelinePoint};
use crate::trace::load_trace;
use crate::units::Bytes;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace files (gzip or plain text; format in the traces README).
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,

    /// Print one JSON object per trace (one per line) instead of a table.
    #[arg(long, env = "GPUMEM_JSON")]
    json: bool,

    /// pooled (the caching allocator) or direct (every request to the driver, the baseline).
    #[arg(long, env = "GPUMEM_STRATEGY", value_enum, default_value = "pooled")]
    strategy: Strategy,

    /// Draw requested, in-use and reserved bytes over each trace into this SVG file
    /// (with several traces, the trace name is added before the extension).
    #[arg(long, env = "GPUMEM_PLOT", value_name = "FILE.svg")]
    plot: Option<PathBuf>,

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

pub fn run(args: ReplayArgs) -> Result<(), CliError> {
    // Read every trace before replaying any, so a bad file fails fast and prints nothing else.
    let traces = args
        .traces
        .iter()
        .map(|path| load_trace(path).map_err(|e| CliError::usage(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(plot) = &args.plot {
        check_plot_path(plot)?;
    }
    let base = args.common.memory_config()?;
    let opened = args.common.open()?;
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
    let config = MemoryConfig {
        strategy: args.strategy,
        devices: Some(vec![device]),
        shards: 1,
        idle_pages_kept: args.idle_pages,
        idle_per_mille: args.idle_per_mille,
        // Replay measures the allocator alone: no upkeep thread, no pool cap.
        release_idle_after: None,
        cleanup_interval: None,
        gpu_memory_fraction: 1.0,
        preallocate_bytes: 0,
        ..base
    };
    config.validate().map_err(|e| match e.key.as_str() {
        "idle_per_mille" => CliError::usage(format!("--idle-per-mille: {}", e.message)),
        _ => CliError::usage(e.to_string()),
    })?;
    if !args.json {
        println!(
            "{:<20} {:>9} {:>14} {:>14} {:>9} {:>14} {:>7} {:>9}",
            "TRACE",
            "EVENTS",
            "PEAK REQUESTED",
            "PEAK RESERVED",
            "RES/PEAK",
            "DRIVER A/F",
            "HITS",
            "NS/OP"
        );
    }
    for trace in &traces {
        // A fresh manager per trace: nothing cached from the previous one skews the next.
        let manager = MemoryManager::new(backend.clone(), config.clone())
            .map_err(|e| CliError::runtime(e.to_string()))?;
        let bar = progress_bar(trace.events.len() as u64, &trace.name);
        let (report, timeline) = replay(&manager, device, trace, |done| bar.set_position(done))
            .map_err(|e| CliError::runtime(e.to_string()))?;
        bar.finish_and_clear();
        print_report(&report, args.json)?;
        if let Some(plot) = &args.plot {
            let path = plot_path(plot, &trace.name, traces.len() > 1);
            write_plot(&path, &report, &timeline)?;
        }
    }
    Ok(())
}

fn progress_bar(len: u64, name: &str) -> ProgressBar {
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

fn print_report(report: &ReplayReport, json: bool) -> Result<(), CliError> {
    if json {
        let line = serde_json::to_string(report)
            .map_err(|e| CliError::runtime(format!("could not encode JSON: {e}")))?;
        println!("{line}");
    } else {
        println!(
            "{:<20} {:>9} {:>14} {:>14} {:>9.3} {:>14} {:>6.1}% {:>9.0}",
            report.trace,
            report.events,
            Bytes(report.peak_requested_bytes).to_string(),
            Bytes(report.peak_reserved_bytes).to_string(),
            report.reserved_over_peak,
            format!("{}/{}", report.driver_allocs, report.driver_frees),
            report.pool_hit_ratio * 100.0,
            report.ns_per_op
        );
    }
    Ok(())
}

fn check_plot_path(plot: &Path) -> Result<(), CliError> {
    let parent = match plot.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(CliError::usage(format!(
            "--plot: directory {} does not exist",
            parent.display()
        )));
    }
    if plot.is_dir() {
        return Err(CliError::usage(format!(
            "--plot: {} is a directory; give a file name such as replay.svg",
            plot.display()
        )));
    }
    Ok(())
}

fn plot_path(plot: &Path, trace: &str, several: bool) -> PathBuf {
    if !several {
        return plot.to_path_buf();
    }
    let stem = plot
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("replay");
    let ext = plot.extension().and_then(|s| s.to_str()).unwrap_or("svg");
    plot.with_file_name(format!("{stem}-{trace}.{ext}"))
}

fn write_plot(
    path: &Path,
    report: &ReplayReport,
    timeline: &[TimelinePoint],
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
    write_file_atomically(path, svg.as_bytes())
        .map_err(|e| CliError::runtime(format!("could not write {}: {e}", path.display())))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
