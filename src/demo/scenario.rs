//! The demo's scenarios (`gpumem demo --scenario`): `calm` (the default: pressure on a slow
//! wave, a small bounded leak) and `alerts`, a one-hour timeline that makes each alert of
//! `grafana/alerts.yml` true and keeps it true past that alert's own `for:` — pressure up to
//! critical, refused allocations, a leak that outgrows the leak rule's thresholds, a fragmented
//! pool under pressure, the sampler failing, and on the simulated node agent beside it
//! (`node`) NVML failing and the agent itself going away. This file is only the timeline:
//! what should be true at each moment; `alerts` and `node` make it so.

use std::time::Duration;

/// Which story the demo tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// Pressure on a slow wave, a small leak that stops: nothing pages anyone.
    Calm,
    /// Every shipped alert fires, each for its own reason, within the first 35 minutes.
    Alerts,
}

impl Scenario {
    /// The names `--scenario` takes.
    pub(crate) const NAMES: [&'static str; 2] = ["calm", "alerts"];

    pub(crate) fn parse(name: &str) -> Option<Scenario> {
        match name {
            "calm" => Some(Scenario::Calm),
            "alerts" => Some(Scenario::Alerts),
            _ => None,
        }
    }
}

const fn minutes(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

/// The timeline repeats: at its end the leaky worker restarts (its leak is freed) and the
/// story begins again, so the demo can run for days with bounded memory.
pub(crate) const CYCLE: Duration = minutes(60);

/// How full the device should be (used over total), by the pressure thresholds' levels
/// (medium 60 %, high 80 %, critical 95 % by default): each level with a margin either side.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fill {
    Low,
    Medium,
    High,
    Critical,
}

impl Fill {
    pub(crate) fn ratio(self) -> f64 {
        match self {
            Fill::Low => 0.45,
            Fill::Medium => 0.70,
            Fill::High => 0.88,
            // Past critical (95 %) and short of a full device, like the calm demo's spike.
            Fill::Critical => 0.985,
        }
    }
}

/// One span of the timeline, `[from, to)` within the cycle.
struct Span {
    from: Duration,
    to: Duration,
}

impl Span {
    const fn new(from_minute: u64, to_minute: u64) -> Span {
        Span {
            from: minutes(from_minute),
            to: minutes(to_minute),
        }
    }

    fn holds(&self, at: Duration) -> bool {
        self.from <= at && at < self.to
    }
}

/// Pressure by span; what no span covers is `Fill::Low`. Medium or above from minute 1 to 20
/// keeps the fragmentation alert's pressure half true for its 15 minutes; high and critical
/// from minute 3 to 17 give the high-pressure alert its 5; critical from 10 to 17 the critical
/// alert its 1 and, with the refusals it brings, the out-of-memory alert its 5.
const PRESSURE: [(Span, Fill); 3] = [
    (Span::new(1, 20), Fill::Medium),
    (Span::new(3, 17), Fill::High),
    (Span::new(10, 17), Fill::Critical),
];
/// Requests too large for what is left are refused (one every `REFUSE_EVERY`) while critical.
const REFUSALS: Span = Span::new(10, 17);
pub(crate) const REFUSE_EVERY: Duration = Duration::from_secs(20);
/// The in-process sampler cannot read the device (the driver's memory query fails), after the
/// pressure alerts have had their time: the sampling alert needs 2 minutes.
const SAMPLING_FAILS: Span = Span::new(20, 25);
/// The node agent is down (its pod evicted, say): the exporter-down alert needs 2 minutes.
const AGENT_DOWN: Span = Span::new(3, 7);
/// The node agent's NVML fails, after the agent is back: the NVML alert needs 10 minutes.
const NVML_FAILS: Span = Span::new(8, 21);
/// The trainer's container is killed and restarts under a new process at this minute, so the
/// agent lists an exited GPU process (for its 15 minutes of retention).
pub(crate) const TRAINER_RESTARTS: Duration = minutes(26);
/// The leak starts once the model is loaded and grows this much a minute, all cycle long:
/// past 256 MiB within 3 minutes, and 128 MiB a minute is twice 64 MiB an hour sixty times.
pub(crate) const LEAK_FROM: Duration = Duration::from_secs(30);
pub(crate) const LEAK_PER_MINUTE: u64 = 128 * gpumem::units::MIB;

/// What the `alerts` scenario wants true `at` this point of the cycle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Moment {
    pub fill: Fill,
    pub refuse: bool,
    pub sampling_fails: bool,
    pub agent_down: bool,
    pub nvml_fails: bool,
    pub trainer_restarted: bool,
}

/// The moment `elapsed` since the demo started (the timeline repeats every [`CYCLE`]).
pub(crate) fn moment(elapsed: Duration) -> Moment {
    let at = in_cycle(elapsed);
    let fill = PRESSURE
        .iter()
        .rev()
        .find(|(span, _)| span.holds(at))
        .map(|(_, fill)| *fill)
        .unwrap_or(Fill::Low);
    Moment {
        fill,
        refuse: REFUSALS.holds(at),
        sampling_fails: SAMPLING_FAILS.holds(at),
        agent_down: AGENT_DOWN.holds(at),
        nvml_fails: NVML_FAILS.holds(at),
        trainer_restarted: at >= TRAINER_RESTARTS,
    }
}

/// Where `elapsed` falls in the current cycle.
pub(crate) fn in_cycle(elapsed: Duration) -> Duration {
    Duration::from_nanos((elapsed.as_nanos() % CYCLE.as_nanos()) as u64)
}

/// Which cycle `elapsed` falls in (0 first).
pub(crate) fn cycle(elapsed: Duration) -> u64 {
    (elapsed.as_nanos() / CYCLE.as_nanos()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest stretch, within one cycle, during which `holds` is true throughout.
    fn longest(holds: impl Fn(Moment) -> bool) -> Duration {
        let step = Duration::from_secs(1);
        let (mut best, mut run) = (Duration::ZERO, Duration::ZERO);
        let mut at = Duration::ZERO;
        while at < CYCLE {
            run = if holds(moment(at)) {
                run + step
            } else {
                Duration::ZERO
            };
            best = best.max(run);
            at += step;
        }
        best
    }

    /// Each condition lasts longer than its alert's `for:` with time to spare for scrapes,
    /// evaluations and the series' own delays (a leak's age, a rate's window).
    #[test]
    fn each_condition_outlasts_its_alerts_for_window() {
        let high = longest(|m| matches!(m.fill, Fill::High | Fill::Critical));
        assert!(high >= minutes(5) + minutes(3), "high {high:?}");
        let critical = longest(|m| m.fill == Fill::Critical);
        assert!(critical >= minutes(1) + minutes(3), "critical {critical:?}");
        let medium = longest(|m| m.fill != Fill::Low && !m.sampling_fails);
        assert!(medium >= minutes(15) + minutes(3), "medium {medium:?}");
        // increase(...[5m]) > 0 for 5m: refusals for at least 5 minutes after the first.
        assert!(longest(|m| m.refuse) >= minutes(6));
        assert!(longest(|m| m.refuse && m.fill == Fill::Critical) >= minutes(6));
        assert!(longest(|m| m.sampling_fails) >= minutes(2) + minutes(2));
        assert!(longest(|m| m.agent_down) >= minutes(2) + minutes(2));
        assert!(longest(|m| m.nvml_fails && !m.agent_down) >= minutes(10) + minutes(2));
        // 30 minutes of growth past 256 MiB, plus the leak age and the 10-minute window.
        let leak_past_threshold = LEAK_FROM + minutes(256 * gpumem::units::MIB / LEAK_PER_MINUTE);
        assert!(CYCLE >= leak_past_threshold + minutes(30) + minutes(12));
    }

    /// The pressure alerts are not disturbed by the sampler failing: it fails only after
    /// them, and never while the device is meant to be above low.
    #[test]
    fn the_sampler_fails_only_after_the_pressure_alerts_had_their_time() {
        for second in 0..CYCLE.as_secs() {
            let m = moment(Duration::from_secs(second));
            if m.sampling_fails {
                assert!(Duration::from_secs(second) >= minutes(20));
                assert!(!m.refuse);
            }
            assert!(!(m.agent_down && m.nvml_fails), "at {second} s");
        }
    }

    #[test]
    fn the_timeline_repeats() {
        assert_eq!(moment(minutes(11)), moment(CYCLE + minutes(11)));
        assert_eq!(cycle(CYCLE + minutes(1)), 1);
        assert_eq!(in_cycle(CYCLE + minutes(1)), minutes(1));
        assert_eq!(Scenario::parse("alerts"), Some(Scenario::Alerts));
        assert_eq!(Scenario::parse("loud"), None);
    }
}
