//! What the exporter and the publisher both sample, and how: the managers and the settings their
//! builders share (one set of builder methods, [`sampling_setters!`]), completed from the first
//! manager's own configuration where the embedder set nothing.

use super::MIN_INTERVAL;
use crate::flight::FlightSettings;
use gpumem::manager::{MemoryManager, PressureThresholds};
use gpumem::snapshot::CaptureSettings;
use std::time::Duration;

/// The options behind [`sampling_setters!`], as a builder collects them.
#[derive(Default)]
pub(crate) struct SamplingOptions {
    pub(crate) managers: Vec<MemoryManager>,
    pub(crate) interval: Option<Duration>,
    pub(crate) leak_age: Option<Duration>,
    pub(crate) pressure: Option<PressureThresholds>,
    pub(crate) long_lived_tags: Option<Vec<String>>,
    pub(crate) top_tags: Option<usize>,
    pub(crate) flight: Option<FlightSettings>,
}

impl SamplingOptions {
    /// The capture settings: what was set, else the first manager's leak age and pressure
    /// thresholds (so the page and the manager's own callbacks agree), else the defaults. An
    /// interval under [`MIN_INTERVAL`] comes back as the error.
    pub(crate) fn capture_settings(&self) -> Result<CaptureSettings, Duration> {
        let defaults = CaptureSettings::default();
        let first = self.managers.first().map(MemoryManager::config);
        let interval = self.interval.unwrap_or(defaults.interval);
        if interval < MIN_INTERVAL {
            return Err(interval);
        }
        Ok(CaptureSettings {
            interval,
            leak_age: self
                .leak_age
                .or(first.map(|config| config.leak_age))
                .unwrap_or(defaults.leak_age),
            pressure: self
                .pressure
                .or(first.map(|config| config.pressure))
                .unwrap_or(defaults.pressure),
            long_lived_tags: self
                .long_lived_tags
                .clone()
                .unwrap_or(defaults.long_lived_tags),
            tags_listed: self.top_tags.unwrap_or(defaults.tags_listed),
            ..defaults
        })
    }
}

/// The builder methods of [`SamplingOptions`], for a builder with a `sampling` field: the
/// exporter's and the publisher's take the same options and document them once.
macro_rules! sampling_setters {
    () => {
        /// A manager to sample; call once per manager (managers should share one backend).
        pub fn manager(mut self, manager: ::gpumem::manager::MemoryManager) -> Self {
            self.sampling.managers.push(manager);
            self
        }

        /// How often to sample (default 1 s, at least 100 ms).
        pub fn interval(mut self, interval: std::time::Duration) -> Self {
            self.sampling.interval = Some(interval);
            self
        }

        /// Age after which a live allocation is a leak suspect (default: the first manager's
        /// `leak_age`).
        pub fn leak_age(mut self, age: std::time::Duration) -> Self {
            self.sampling.leak_age = Some(age);
            self
        }

        /// Where the pressure levels start (default: the first manager's `pressure` thresholds).
        pub fn pressure_thresholds(
            mut self,
            thresholds: ::gpumem::manager::PressureThresholds,
        ) -> Self {
            self.sampling.pressure = Some(thresholds);
            self
        }

        /// Tags expected to live for the whole run, never leak suspects (default: `weights`).
        pub fn long_lived_tags<S: Into<String>>(
            mut self,
            tags: impl IntoIterator<Item = S>,
        ) -> Self {
            self.sampling.long_lived_tags = Some(tags.into_iter().map(Into::into).collect());
            self
        }

        /// How many tags per device are listed by name (default 10); the rest are summed as
        /// `other`, so the number of series stays fixed.
        pub fn top_tags(mut self, count: usize) -> Self {
            self.sampling.top_tags = Some(count.max(1));
            self
        }

        /// Runs the OOM flight recorder with these settings (where records are written and how
        /// many are kept). The exporter records in memory by default (`/api/v1/oom`, the page);
        /// a publisher records only when asked (with an exporter in the same process, let the
        /// exporter record, or every record is written twice).
        pub fn flight(mut self, settings: $crate::flight::FlightSettings) -> Self {
            self.sampling.flight = Some(settings);
            self
        }
    };
}
pub(crate) use sampling_setters;
