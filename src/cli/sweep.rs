//! `gpumem replay --sweep`: every trace under every cache setting (the largest chunk a miss
//! creates, whether growth is cut whole, whether blocks go to mapped pages first, idle pages
//! kept, idle pages per 1024 of the peak), replayed in rounds so that the
//! `--repeat` replays of one setting alternate with the others' and drift on a busy host falls
//! on all of them; each setting's median replay is reported. On the CUDA backend the driver's
//! own pool is replayed in every round beside them, and the setting that holds no more memory
//! than the pool *and* takes no more time per operation is named, with the variables that
//! select it, and after several traces the one setting that does so on the most of them.
//! `--against-driver-pool` is the same for the one setting given. With the adaptive default
//! (the configuration's `cache_mode`), the sweep replays it in every round too and says, for
//! each trace, where it landed beside the setting the sweep names.

use super::replay::{median_run, micros, print_report, progress_bar, replay_fresh};
use super::CliError;
use gpumem::backend::DeviceBackend;
use gpumem::manager::{CacheMode, MemoryConfig};
use gpumem::named::Named;
use gpumem::units::{Bytes, MIB};
use gpumem_replay::replay::{replay_driver_pool, ReplayReport, TimelinePoint};
use gpumem_replay::trace::Trace;
use std::sync::Arc;

/// The cache settings tried: idle pages kept, idle pages per 1024 of the peak, how a miss cuts
/// its pages (the largest chunk, and whether a growing arena maps a block's pages as one
/// chunk), and whether blocks go to free mapped pages first. 256 idle pages (512 MiB) is the
/// end that buys time with memory; 128 MiB chunks are for processes whose blocks are hundreds
/// of MiB and change size every request (a VAE decoder's activations), where the driver
/// charges a miss per chunk; whole chunks when growing make a process's first large misses
/// cheap, and with 2 MiB chunks and no idle pages they are the least memory of all (every trace
/// of the corpus at or under 1.03 on an H100, at several times the time); placing on mapped
/// pages turns misses that only move idle pages into hits (docs/performance.md).
const IDLE_PAGES: [usize; 5] = [0, 4, 16, 64, 256];
const IDLE_PER_MILLE: [usize; 2] = [0, 8];
const LAYOUTS: [Layout; 9] = [
    Layout::chunks(2 * MIB),
    Layout {
        whole_when_growing: true,
        ..Layout::chunks(2 * MIB)
    },
    Layout::chunks(6 * MIB),
    Layout {
        whole_when_growing: true,
        ..Layout::chunks(6 * MIB)
    },
    Layout::chunks(32 * MIB),
    Layout::chunks(128 * MIB),
    Layout::chunks(6 * MIB).on_mapped_pages(),
    Layout::chunks(32 * MIB).on_mapped_pages(),
    Layout::chunks(128 * MIB).on_mapped_pages(),
];

/// How the sweep has a miss cut its pages into chunks, and where it places blocks.
#[derive(Clone, Copy)]
struct Layout {
    max_chunk_bytes: u64,
    whole_when_growing: bool,
    on_mapped_pages: bool,
}

impl Layout {
    const fn chunks(max_chunk_bytes: u64) -> Layout {
        Layout {
            max_chunk_bytes,
            whole_when_growing: false,
            on_mapped_pages: false,
        }
    }

    const fn on_mapped_pages(self) -> Layout {
        Layout {
            on_mapped_pages: true,
            ..self
        }
    }
}

/// What one sweep replays on.
pub(super) struct Sweep<'a> {
    pub backend: &'a Arc<dyn DeviceBackend>,
    pub device: usize,
    pub base: &'a MemoryConfig,
    /// Every setting of the grid, or only `base` (`--against-driver-pool`).
    pub grid: bool,
    pub repeat: u32,
    /// The driver's pool to compare with (CUDA only).
    pub driver_pool: Option<&'a dyn DeviceBackend>,
    pub json: bool,
}

type Replayed = (ReplayReport, Vec<TimelinePoint>);

impl Sweep<'_> {
    pub(super) fn run(&self, traces: &[Trace]) -> Result<(), CliError> {
        let mut against_pool = Vec::new();
        for trace in traces {
            let (mut reports, pool) = self.replay_all(trace)?;
            if self.json {
                for report in reports.iter().chain(&pool) {
                    print_report(report, true)?;
                }
                continue;
            }
            // The adaptive default's replay is not a setting of the grid: it is reported apart.
            let adaptive = self.sweeps_adaptive().then(|| reports.pop()).flatten();
            self.print_table(trace, &reports, pool.as_ref());
            if let Some(adaptive) = &adaptive {
                println!("{}", landed(adaptive, &reports, pool.as_ref()));
                println!();
            }
            if let Some(pool) = pool {
                against_pool.push((reports, pool));
            }
        }
        if self.grid && !self.json && against_pool.len() > 1 {
            println!("{}", one_setting_for_all(&against_pool));
        }
        Ok(())
    }

    /// Whether the grid's rounds also replay the adaptive default (the base's cache mode).
    fn sweeps_adaptive(&self) -> bool {
        self.grid && self.base.cache_mode == CacheMode::Adaptive
    }

    /// The grid's settings, each fixed, then the base itself when it adapts.
    fn settings(&self) -> Vec<MemoryConfig> {
        if !self.grid {
            return vec![self.base.clone()];
        }
        let mut settings = self.grid_settings();
        if self.sweeps_adaptive() {
            settings.push(self.base.clone());
        }
        settings
    }

    fn grid_settings(&self) -> Vec<MemoryConfig> {
        LAYOUTS
            .iter()
            .flat_map(|&layout| {
                IDLE_PAGES.iter().flat_map(move |&idle_pages_kept| {
                    IDLE_PER_MILLE
                        .iter()
                        .map(move |&idle_per_mille| MemoryConfig {
                            idle_pages_kept,
                            idle_per_mille,
                            max_chunk_bytes: layout.max_chunk_bytes,
                            whole_chunks_when_growing: layout.whole_when_growing,
                            place_on_mapped_pages: layout.on_mapped_pages,
                            cache_mode: CacheMode::Fixed,
                            ..self.base.clone()
                        })
                })
            })
            .collect()
    }

    /// Every setting's median replay, and the driver pool's, from `repeat` alternating rounds.
    fn replay_all(
        &self,
        trace: &Trace,
    ) -> Result<(Vec<ReplayReport>, Option<ReplayReport>), CliError> {
        let settings = self.settings();
        let mut runs: Vec<Vec<Replayed>> = vec![Vec::new(); settings.len()];
        let mut pool_runs = Vec::new();
        for round in 1..=self.repeat {
            for (config, runs) in settings.iter().zip(runs.iter_mut()) {
                let label = format!(
                    "{} ({}{}{}{}/{}/{}, {round}/{})",
                    trace.name,
                    if config.cache_mode == CacheMode::Adaptive {
                        "adaptive from "
                    } else {
                        ""
                    },
                    Bytes(config.max_chunk_bytes),
                    if config.whole_chunks_when_growing {
                        " whole"
                    } else {
                        ""
                    },
                    if config.place_on_mapped_pages {
                        " placed"
                    } else {
                        ""
                    },
                    config.idle_pages_kept,
                    config.idle_per_mille,
                    self.repeat
                );
                let bar = progress_bar(trace.events.len() as u64, &label);
                let progress = |done| bar.set_position(done);
                let replayed =
                    replay_fresh(self.backend, self.device, config, trace, progress, None)?
                        .map_err(|e| CliError::runtime(e.to_string()))?;
                bar.finish_and_clear();
                runs.push(replayed);
            }
            if let Some(cuda) = self.driver_pool {
                let label = format!("{} (driver pool, {round}/{})", trace.name, self.repeat);
                let bar = progress_bar(trace.events.len() as u64, &label);
                let progress = |done| bar.set_position(done);
                let replayed = replay_driver_pool(cuda, self.device, trace, progress)
                    .map_err(|e| CliError::runtime(e.to_string()))?;
                bar.finish_and_clear();
                pool_runs.push(replayed);
            }
        }
        let reports = runs.into_iter().map(|r| median_run(r).0).collect();
        let pool = (!pool_runs.is_empty()).then(|| median_run(pool_runs).0);
        Ok((reports, pool))
    }

    fn print_table(&self, trace: &Trace, reports: &[ReplayReport], pool: Option<&ReplayReport>) {
        let defaults = MemoryConfig::default();
        let median = match self.repeat {
            1 => String::new(),
            n => format!(", medians of {n} alternated replays"),
        };
        println!(
            "{}: waste against time per operation ({} backend{median}); * = on the frontier",
            trace.name,
            self.backend.kind()
        );
        println!(
            "  {:>10} {:>5} {:>6} {:>10} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8}",
            "CHUNK",
            "WHOLE",
            "MAPPED",
            "IDLE PAGES",
            "PER MILLE",
            "RES/PEAK",
            "NS/OP",
            "MISSES",
            "MISS P50",
            "MISS P99",
            "CREATED"
        );
        for report in reports {
            // A row replayed at the adaptive default (`--against-driver-pool` at the default
            // cache mode) is the default wherever it landed; among fixed settings, the one with
            // the configured keys' defaults.
            let is_default = report.cache_mode == CacheMode::Adaptive.name()
                || (report.idle_pages_kept == defaults.idle_pages_kept
                    && report.idle_per_mille == defaults.idle_per_mille
                    && report.max_chunk_bytes == defaults.max_chunk_bytes
                    && report.whole_chunks_when_growing == defaults.whole_chunks_when_growing
                    && report.place_on_mapped_pages == defaults.place_on_mapped_pages);
            let yes_no = |on: bool| if on { "yes" } else { "no" };
            println!(
                "{} {:>10} {:>5} {:>6} {:>10} {:>9} {:>9.4} {:>9.0} {:>7} {:>9} {:>9} {:>8}{}",
                if dominated(report, reports) { " " } else { "*" },
                Bytes(report.max_chunk_bytes).to_string(),
                yes_no(report.whole_chunks_when_growing),
                yes_no(report.place_on_mapped_pages),
                report.idle_pages_kept,
                report.idle_per_mille,
                report.reserved_over_peak,
                report.ns_per_op,
                report.misses,
                micros(report.miss_p50_ns),
                micros(report.miss_p99_ns),
                report.pages_created,
                if is_default { "  (default)" } else { "" }
            );
        }
        match pool {
            Some(pool) => println!("{}", verdict(reports, pool)),
            None => println!(
                "  (the simulated device has no driver pool to compare with: sweep on the CUDA \
                 backend to name the setting that beats it on both axes)"
            ),
        }
        println!();
    }
}

/// The line under a trace's table that says where the adaptive default landed: its level and
/// setting, its figures, against the pool's time where there is a pool, and beside the setting
/// the sweep names (the leanest that beats the pool, else the fastest within its memory; on the
/// simulated device, the fastest on the frontier within the adaptive default's memory).
fn landed(
    adaptive: &ReplayReport,
    reports: &[ReplayReport],
    pool: Option<&ReplayReport>,
) -> String {
    let level = adaptive
        .adaptive_level
        .map_or("?".to_string(), |l| l.to_string());
    let mut line = format!(
        "  adaptive default: landed at level {level} ({}) with {:.4} reserved/peak, {:.0} ns/op",
        setting(adaptive),
        adaptive.reserved_over_peak,
        adaptive.ns_per_op
    );
    if let Some(pool) = pool {
        line += &format!(
            ", {:.2}x the pool's time{}",
            adaptive.ns_per_op / pool.ns_per_op,
            if adaptive.reserved_over_peak <= pool.reserved_over_peak
                && adaptive.ns_per_op <= pool.ns_per_op
            {
                ": at or under the pool on both"
            } else {
                ""
            }
        );
    }
    let named = match pool {
        Some(pool) => beating_the_pool(reports, pool)
            .first()
            .copied()
            .or_else(|| {
                reports
                    .iter()
                    .filter(|r| r.reserved_over_peak <= pool.reserved_over_peak)
                    .min_by(|a, b| a.ns_per_op.total_cmp(&b.ns_per_op))
            }),
        None => reports
            .iter()
            .filter(|r| r.reserved_over_peak <= adaptive.reserved_over_peak)
            .min_by(|a, b| a.ns_per_op.total_cmp(&b.ns_per_op)),
    };
    if let Some(named) = named {
        line += &format!(
            "\n  beside the named setting: {} ({:.4}, {:.0} ns/op; the adaptive default at {:.2}x its time)",
            setting(named),
            named.reserved_over_peak,
            named.ns_per_op,
            adaptive.ns_per_op / named.ns_per_op
        );
    }
    line
}

/// Whether another report is at least as good on both axes and better on one.
fn dominated(report: &ReplayReport, all: &[ReplayReport]) -> bool {
    all.iter().any(|other| {
        other.reserved_over_peak <= report.reserved_over_peak
            && other.ns_per_op <= report.ns_per_op
            && (other.reserved_over_peak < report.reserved_over_peak
                || other.ns_per_op < report.ns_per_op)
    })
}

/// The settings that hold no more memory than the pool and take no more time at the median:
/// first those faster than the pool in every round, then the rest, each the least memory first
/// (then the least time). The least memory that wins only at the median is often a setting
/// whose time sits at the pool's, and another call's rounds put it on the other side.
fn beating_the_pool<'a>(reports: &'a [ReplayReport], pool: &ReplayReport) -> Vec<&'a ReplayReport> {
    let mut winners: Vec<&ReplayReport> = reports
        .iter()
        .filter(|r| {
            r.reserved_over_peak <= pool.reserved_over_peak && r.ns_per_op <= pool.ns_per_op
        })
        .collect();
    winners.sort_by(|a, b| {
        let at_median_only = |r: &ReplayReport| !faster_every_round(r, pool);
        at_median_only(a)
            .cmp(&at_median_only(b))
            .then(a.reserved_over_peak.total_cmp(&b.reserved_over_peak))
            .then(a.ns_per_op.total_cmp(&b.ns_per_op))
    });
    winners
}

/// Whether `report` took no more time than the pool in each alternated round. A round replays
/// every setting and then the pool, so its figures share the host's state of the moment; with
/// one round, the single figures are compared.
fn faster_every_round(report: &ReplayReport, pool: &ReplayReport) -> bool {
    let (ours, theirs) = (&report.ns_per_op_runs, &pool.ns_per_op_runs);
    if ours.is_empty() || ours.len() != theirs.len() {
        return report.ns_per_op <= pool.ns_per_op;
    }
    ours.iter().zip(theirs).all(|(ours, theirs)| ours <= theirs)
}

/// The variables that select a report's setting, ready to prefix a command with (fixed: without
/// `GPUMEM_CACHE_MODE=fixed` they would be where the adaptive default starts). Keys at their
/// defaults are left out, but for the chunk and idle keys every setting names.
fn setting(report: &ReplayReport) -> String {
    // The adaptive default's rungs cut long misses in larger inside chunks than the configured
    // 16 MiB: named without them, its landing replayed fixed with 16 MiB ones (pointcloud's
    // level 3 on the simulated H100: 1.0307 of its peak at 2.2x the time, not 1.0731).
    let inside = if report.inside_chunk_bytes != MemoryConfig::default().inside_chunk_bytes {
        format!(
            " GPUMEM_INSIDE_CHUNK_BYTES={}",
            variable_bytes(report.inside_chunk_bytes)
        )
    } else {
        String::new()
    };
    let whole = if report.whole_chunks_when_growing {
        " GPUMEM_WHOLE_CHUNKS_WHEN_GROWING=true"
    } else {
        ""
    };
    let placed = if report.place_on_mapped_pages {
        " GPUMEM_PLACE_ON_MAPPED_PAGES=true"
    } else {
        ""
    };
    let ahead = if report.map_ahead_when_growing {
        " GPUMEM_MAP_AHEAD_WHEN_GROWING=true"
    } else {
        ""
    };
    format!(
        "GPUMEM_CACHE_MODE=fixed GPUMEM_MAX_CHUNK_BYTES={} GPUMEM_IDLE_PAGES_KEPT={} GPUMEM_IDLE_PER_MILLE={}{inside}{whole}{placed}{ahead}",
        variable_bytes(report.max_chunk_bytes),
        report.idle_pages_kept,
        report.idle_per_mille
    )
}

/// `bytes` as a variable's value (`32.00MiB`: no space to quote).
fn variable_bytes(bytes: u64) -> String {
    Bytes(bytes).to_string().replace(' ', "")
}

/// The line under a sweep of several traces: the one setting that beats the driver pool on
/// both axes on the most of them (on a tie, the least memory summed over all of them), so that
/// a process running all of that work can pick one. Every trace's reports come in the same
/// order of settings.
fn one_setting_for_all(traces: &[(Vec<ReplayReport>, ReplayReport)]) -> String {
    let settings = traces
        .iter()
        .map(|(reports, _)| reports.len())
        .min()
        .unwrap_or(0);
    let score = |at: usize| {
        let (mut wins, mut memory) = (0usize, 0.0f64);
        for (reports, pool) in traces {
            let report = &reports[at];
            wins += usize::from(
                report.reserved_over_peak <= pool.reserved_over_peak
                    && report.ns_per_op <= pool.ns_per_op,
            );
            memory += report.reserved_over_peak;
        }
        (wins, memory)
    };
    let best = (0..settings).max_by(|&a, &b| {
        let ((wins_a, memory_a), (wins_b, memory_b)) = (score(a), score(b));
        wins_a.cmp(&wins_b).then(memory_b.total_cmp(&memory_a))
    });
    match best.map(|at| (at, score(at))) {
        Some((at, (wins, _))) if wins > 0 => format!(
            "One setting for all {} traces: {} beats the driver pool on both axes on {wins} of them; \
             no setting does on more, and of those that do as well it holds the least memory",
            traces.len(),
            setting(&traces[0].0[at])
        ),
        _ => format!(
            "No setting beats the driver pool on both axes on any of the {} traces",
            traces.len()
        ),
    }
}

/// The lines under a table: the driver pool's figures and the setting that beats them on both
/// axes, or, when none does, the fastest setting within the pool's memory and its gap. Where a
/// setting beats the pool, the fastest within its memory is named too when it is another: the
/// leanest winner suits a user who wants the memory back, the fastest one a user who wants the
/// time, and it is the one whose lead survives the next call's rounds (the pool's own time
/// moves by up to 2.6x within one call, docs/gpu-results.md).
fn verdict(reports: &[ReplayReport], pool: &ReplayReport) -> String {
    let head = format!(
        "  driver pool (cuMemAllocAsync): {:.4} reserved/peak, {:.0} ns/op",
        pool.reserved_over_peak, pool.ns_per_op
    );
    let fastest = reports
        .iter()
        .filter(|r| r.reserved_over_peak <= pool.reserved_over_peak)
        .min_by(|a, b| a.ns_per_op.total_cmp(&b.ns_per_op));
    match (beating_the_pool(reports, pool).first(), fastest) {
        (Some(&leanest), Some(fastest)) => {
            let mut lines = format!(
                "{head}\n  beats the driver pool on both: {}",
                described(leanest, pool)
            );
            if !std::ptr::eq(leanest, fastest) {
                lines += &format!(
                    "\n  fastest within its memory: {}",
                    described(fastest, pool)
                );
            }
            lines
        }
        (_, Some(closest)) => format!(
            "{head}\n  no setting beats the driver pool on both; the fastest within its \
             memory: {})",
            figures(closest, pool)
        ),
        (_, None) => format!("{head}\n  no setting holds as little memory as the driver pool"),
    }
}

/// A setting by its variables, then its figures against the pool's, in a parenthesis left open
/// for the caller to add to and close.
fn figures(report: &ReplayReport, pool: &ReplayReport) -> String {
    format!(
        "{} ({:.4}, {:.0} ns/op, {:.2}x its time",
        setting(report),
        report.reserved_over_peak,
        report.ns_per_op,
        report.ns_per_op / pool.ns_per_op
    )
}

/// A setting that beats the pool, by its variables, its figures, and whether it was faster in
/// every round.
fn described(report: &ReplayReport, pool: &ReplayReport) -> String {
    format!(
        "{}{})",
        figures(report, pool),
        match report.ns_per_op_runs.len() {
            0 | 1 => String::new(),
            rounds if faster_every_round(report, pool) => {
                format!("; faster in each of the {rounds} rounds")
            }
            _ => "; at the median only: not faster in every round".to_string(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rop: f64, ns: f64, pages: usize) -> ReplayReport {
        ReplayReport {
            reserved_over_peak: rop,
            ns_per_op: ns,
            idle_pages_kept: pages,
            inside_chunk_bytes: MemoryConfig::default().inside_chunk_bytes,
            ..ReplayReport::default()
        }
    }

    #[test]
    fn the_least_memory_of_the_settings_that_beat_the_pool_is_named() {
        let pool = report(1.09, 1400.0, 0);
        let reports = [
            report(1.03, 2000.0, 4),
            report(1.05, 1100.0, 64),
            report(1.04, 1300.0, 16),
        ];
        let text = verdict(&reports, &pool);
        let named = text.lines().nth(1).unwrap_or_default();
        assert!(named.contains("GPUMEM_IDLE_PAGES_KEPT=16 "), "{text}");
        assert!(
            named.contains("(1.0400, 1300 ns/op, 0.93x its time)"),
            "{text}"
        );
    }

    #[test]
    fn the_fastest_setting_within_the_pools_memory_is_named_too_when_it_is_another() {
        let pool = report(1.09, 1400.0, 0);
        let lean = report(1.03, 1300.0, 4);
        let fast = report(1.08, 400.0, 256);
        let over_the_pools_memory = report(1.10, 100.0, 1024);
        let text = verdict(&[lean.clone(), fast, over_the_pools_memory], &pool);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].contains("GPUMEM_IDLE_PAGES_KEPT=4 "), "{text}");
        assert!(
            lines[2].starts_with(
                "  fastest within its memory: GPUMEM_CACHE_MODE=fixed GPUMEM_MAX_CHUNK_BYTES="
            ) && lines[2].contains("GPUMEM_IDLE_PAGES_KEPT=256 ")
                && lines[2].contains("(1.0800, 400 ns/op, 0.29x its time)"),
            "{text}"
        );
        // When the leanest winner is also the fastest, it is named once.
        let text = verdict(&[lean, report(1.05, 1500.0, 16)], &pool);
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    fn rounds(mut report: ReplayReport, runs: &[f64]) -> ReplayReport {
        report.ns_per_op_runs = runs.to_vec();
        report
    }

    #[test]
    fn a_setting_faster_in_every_round_is_named_before_a_leaner_one_faster_at_the_median_only() {
        let pool = rounds(report(1.09, 1400.0, 0), &[1400.0, 1300.0, 1500.0]);
        let lean = rounds(report(1.03, 1320.0, 4), &[1350.0, 1320.0, 1200.0]);
        let steady = rounds(report(1.05, 1100.0, 64), &[1100.0, 1050.0, 1200.0]);
        let text = verdict(&[lean.clone(), steady], &pool);
        assert!(text.contains("GPUMEM_IDLE_PAGES_KEPT=64 "), "{text}");
        assert!(text.contains("faster in each of the 3 rounds"), "{text}");
        // With no setting faster in every round, the leanest median winner is named, and said so.
        let text = verdict(&[lean], &pool);
        assert!(text.contains("GPUMEM_IDLE_PAGES_KEPT=4 "), "{text}");
        assert!(text.contains("at the median only"), "{text}");
    }

    #[test]
    fn a_setting_off_the_defaults_is_named_with_its_variables() {
        let pool = report(1.09, 1400.0, 0);
        let whole = ReplayReport {
            whole_chunks_when_growing: true,
            ..report(1.02, 1000.0, 4)
        };
        let placed = ReplayReport {
            place_on_mapped_pages: true,
            ..report(1.02, 1000.0, 4)
        };
        let ahead = ReplayReport {
            map_ahead_when_growing: true,
            ..report(1.02, 1000.0, 4)
        };
        let inside = ReplayReport {
            inside_chunk_bytes: 64 * MIB,
            ..report(1.02, 1000.0, 4)
        };
        for (winner, variable) in [
            (whole, "GPUMEM_WHOLE_CHUNKS_WHEN_GROWING=true"),
            (placed, "GPUMEM_PLACE_ON_MAPPED_PAGES=true"),
            (ahead, "GPUMEM_MAP_AHEAD_WHEN_GROWING=true"),
            (inside, "GPUMEM_INSIDE_CHUNK_BYTES=64.00MiB"),
        ] {
            let text = verdict(&[report(1.03, 2000.0, 4), winner], &pool);
            assert!(
                text.contains(&format!("GPUMEM_IDLE_PER_MILLE=0 {variable} (")),
                "{text}"
            );
        }
        let plain = verdict(&[report(1.02, 1000.0, 4)], &pool);
        assert!(
            !plain.contains("WHOLE") && !plain.contains("PLACE") && !plain.contains("INSIDE"),
            "{plain}"
        );
    }

    #[test]
    fn the_setting_that_beats_the_pool_on_the_most_traces_is_named_for_all() {
        let pool = report(1.05, 1000.0, 0);
        let (lean, fast) = (report(1.01, 1500.0, 4), report(1.04, 900.0, 64));
        // The fast setting wins on both traces, the lean one on neither.
        let traces = vec![
            (vec![lean.clone(), fast.clone()], pool.clone()),
            (vec![lean.clone(), fast.clone()], pool.clone()),
        ];
        let text = one_setting_for_all(&traces);
        assert!(text.contains("GPUMEM_IDLE_PAGES_KEPT=64 "), "{text}");
        assert!(text.contains("on 2 of them"), "{text}");
        let slow_pool = report(1.00, 100.0, 0);
        let none = one_setting_for_all(&[(vec![lean, fast], slow_pool)]);
        assert!(none.starts_with("No setting"), "{none}");
    }

    #[test]
    fn without_a_winner_the_fastest_within_the_pools_memory_and_its_gap_are_said() {
        let pool = report(1.09, 1000.0, 0);
        let reports = [report(1.03, 2000.0, 4), report(1.05, 1500.0, 64)];
        let text = verdict(&reports, &pool);
        assert!(
            text.contains("no setting beats the driver pool on both"),
            "{text}"
        );
        assert!(text.contains("GPUMEM_IDLE_PAGES_KEPT=64 "), "{text}");
        assert!(text.contains("1.50x its time"), "{text}");
    }
}
