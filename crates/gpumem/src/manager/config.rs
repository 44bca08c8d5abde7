//! How a `MemoryManager` allocates and looks after its memory: strategy, limits, caching,
//! leak tracking, pressure and upkeep — with presets, a builder and validation that names the
//! key that is wrong. Loading from a TOML file and the environment is in `config_file`.

use super::pressure::PressureThresholds;
pub use crate::error::ConfigError;
use crate::pool::PoolSettings;
use crate::units::{GIB, KIB, MIB};
use serde::Serialize;
use std::time::Duration;

/// What one of the configuration guide's "cached buffers" (`max_cached_buffers`) stands for: one
/// page at the granularity of the CUDA and simulated backends.
pub const CACHED_BUFFER_BYTES: u64 = 2 * MIB;

/// Pooled (the caching allocator) or direct (every request to the driver: the baseline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Caching arenas over the driver's virtual memory API.
    Pooled,
    /// No pooling: `cuMemAlloc`/`cuMemFree` for every request.
    Direct,
}

impl crate::named::Named for Strategy {
    const CHOICES: &'static [crate::named::Choice<Self>] = &[
        crate::named::Choice::plain("pooled", Strategy::Pooled),
        crate::named::Choice::plain("direct", Strategy::Direct),
    ];
}

/// How the pools choose their cache setting (chunk sizes, idle pages kept, placement).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheMode {
    /// Start at the configured setting and move with what misses cost and the pressure:
    /// more kept while misses cost time and the device has room, memory-first under pressure,
    /// never past the ceiling (`manager/adaptive.rs`, docs/allocator.md).
    Adaptive,
    /// The least memory (2 MiB chunks cut whole when growing, no idle pages): at or under 1.03
    /// of the peak on every trace of the corpus, at several times the time.
    MemoryFirst,
    /// Exactly the configured `max_chunk_bytes`, `idle_pages_kept` and the rest, never moved.
    Fixed,
}

impl crate::named::Named for CacheMode {
    const CHOICES: &'static [crate::named::Choice<Self>] = &[
        crate::named::Choice::plain("adaptive", CacheMode::Adaptive),
        crate::named::Choice::plain("memory-first", CacheMode::MemoryFirst),
        crate::named::Choice::plain("fixed", CacheMode::Fixed),
    ];
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryConfig {
    /// `Pooled` (pooling on) or `Direct` (pooling off).
    pub strategy: Strategy,
    /// Backend device indices to manage; `None` manages every device.
    pub devices: Option<Vec<usize>>,
    /// The pools of a device never hold more than this share of its memory (0 < f <= 1).
    pub gpu_memory_fraction: f64,
    /// An absolute cap on what the pools of one device hold (`max_pool_size`).
    pub max_pool_bytes: Option<u64>,
    /// At critical pressure, a request that would leave less than this free on the device
    /// fails at once (or falls back to host memory when `cpu_fallback` is on).
    pub min_free_bytes: u64,
    /// Serve [`alloc_or_host`](super::MemoryManager::alloc_or_host) from host memory when the
    /// device cannot.
    pub cpu_fallback: bool,
    /// Record each allocation's creation time (for leak ages); ids, sizes and tags are always kept.
    pub track_allocations: bool,
    /// Also record the allocating thread's name and a backtrace (slow: for hunting a leak).
    pub capture_backtraces: bool,
    /// Live allocations older than this are leak suspects.
    pub leak_age: Duration,
    pub pressure: PressureThresholds,
    /// Return cached memory to the driver when a device reaches high pressure.
    pub trim_on_high_pressure: bool,
    /// How often a background thread runs the manager's upkeep (pressure levels and callbacks,
    /// idle pages returned by age); `None` leaves it to the caller's `maintain()` (the
    /// exporter's sampler only reads).
    pub cleanup_interval: Option<Duration>,
    /// Upkeep returns pages idle for longer than this; `None` keeps them.
    pub release_idle_after: Option<Duration>,
    /// A cap on idle (cached, unused) bytes per device (the guide's `max_cached_buffers = N` sets
    /// it to N pages of [`CACHED_BUFFER_BYTES`]: gpumem caches pages, not buffers).
    pub max_cached_bytes: Option<u64>,
    /// Map this much per device up front and keep at least this much cached
    /// (`CUDA_MEMORY_POOL_SIZE`).
    pub preallocate_bytes: u64,
    /// Independent pools per device and stream, picked by thread, so threads rarely share a
    /// lock. 0 picks one per core, at most 8; rounded down to a power of two.
    pub shards: usize,
    /// Requests up to this size are served from the small pool.
    pub small_max_bytes: u64,
    /// Freed pages stay mapped (cached for reuse) while a device's pools map no more than the
    /// recent peak of pages under live blocks plus a slack of this many pages...
    pub idle_pages_kept: usize,
    /// ...or this many per 1024 of that peak, whichever is more. Beyond it, the oldest idle
    /// pages go back to the driver. So the pools keep what the workload needed lately (steps
    /// that repeat hit the cache) while holding at most a small slack above its real peak.
    pub idle_per_mille: usize,
    /// The largest piece of physical memory a miss creates: the pages a miss maps are backed
    /// by one chunk up to this size, as the driver charges granting access and unmapping per
    /// chunk, not per byte. A chunk goes back to the driver only once no live block touches any
    /// of its pages, so a larger cap makes misses cheaper and may keep more cached.
    pub max_chunk_bytes: u64,
    /// Chunks inside a long miss (16 MiB by default; 0, or no more than `max_chunk_bytes`:
    /// none). A run of new pages that holds at least four of these between two
    /// `max_chunk_bytes` chunks gets one such chunk at each end and chunks of this size between:
    /// a 460 MB block then costs 29 grants of access, not 74. The pages under one large block
    /// are freed together, and only its ends may share a page with the blocks beside it; but
    /// what is allocated later in its place keeps a large chunk mapped whole, so they stay
    /// moderate (32 MiB: gpt2_train_cycled 1.0314 of its peak). This is their smallest size:
    /// where the cache's slack is larger (peaks from 2 GiB up), they grow to it, and to a
    /// quarter of the run at most.
    pub inside_chunk_bytes: u64,
    /// Whether a miss that takes an arena past the most pages it has held maps its block's own
    /// pages as one chunk (off by default). A cold miss then costs the driver one chunk
    /// whatever its size, less than the driver's own pool charges, and a smaller block that
    /// later lands on such a chunk cuts it again around itself. Measured on the trace corpus it
    /// costs time where the layout changes every step (docs/performance.md): the setting for
    /// a process whose first allocations (a model loading) must be fast.
    pub whole_chunks_when_growing: bool,
    /// Whether a miss that must make room within the cache budget takes only idle pages the
    /// GPU is done with and creates pages for the rest, instead of waiting for the work still
    /// queued on their stream, however far past the budget that goes (off by default; ignored
    /// at high and critical pressure). A host running ahead of its GPU then never stalls at an
    /// allocation, and the process holds what the GPU has in flight: under PyTorch on an H100,
    /// 7 % more reserved memory on GPT-2 training and 13 % on a small CNN server, but 4.9 GB
    /// (15 %) more on a ResNet-50 at batch 2,048, for a round 0.7 % shorter there
    /// (docs/performance.md).
    pub make_room_without_waiting: bool,
    /// How far past the cache budget a miss that must make room may go by creating pages
    /// instead of waiting for the GPU to finish with idle ones (256 MiB by default; 0: it always
    /// waits; ignored at high and critical pressure). A wait costs the same whatever the
    /// process's size, so a fixed room removes the stalls of small processes, whose GPU has
    /// little in flight, and bounds what a large one holds beyond its budget to a sliver of it:
    /// under PyTorch on an H100 it took a small CNN server's miss time from 9.5 to 0.1 ms a
    /// round for 102 MiB, and left a ResNet-50 at batch 2,048 and GPT-2 medium training at
    /// their waiting peaks (docs/performance.md). Replays run no kernels and are the same
    /// whatever it is.
    pub room_without_waiting_bytes: u64,
    /// Whether a miss that must make room from its own stream's idle pages, while the GPU may
    /// still be using them, maps them at its block's address at once instead of waiting. The
    /// pages stay mapped at their old address too until the GPU has passed it; work on one
    /// stream runs in order, so the block's work starts only after the old work ends, as when
    /// a caching allocator hands a freed block to its own stream. `Some(true)` always,
    /// `Some(false)` never; `None` (the default, `"auto"` in a file) lets the adaptive default
    /// start it once a wait for the GPU has lasted
    /// [`LONG_GPU_WAIT_NS`](super::adaptive::LONG_GPU_WAIT_NS), where no gigabyte block was
    /// mapped: a host that far ahead of its GPU stalls at every such wait. Under PyTorch on an
    /// H200 a long-convolution trainer took 0.994–1.001 of the default allocator's round with
    /// it and 1.007–1.014 waiting, at process peaks under expandable segments' both ways; where
    /// the waits are short, lending held up to 40 MiB more and bought nothing
    /// (docs/gpu-results.md). Replays run no kernels and wait for nothing: the same whatever
    /// it is.
    pub stream_ordered_reuse: Option<bool>,
    /// Whether a block the pool's index would place on unmapped pages goes instead to free
    /// bytes whose pages are mapped already, where a stretch of them holds it (off by
    /// default). Misses that only moved idle pages from one place to another become hits: on
    /// the simulated H100 the thirty traces of the corpus took 36 % fewer misses and 0.83× the
    /// time, with higher peaks (nine over 1.03, all but cnn_serve_large still under the
    /// driver's pool; docs/performance.md). The setting for a process that wants speed back
    /// from the memory-first default.
    pub place_on_mapped_pages: bool,
    /// Whether a miss that takes a growing arena to a new high also maps the free pages up to
    /// the end of its last chunk (off by default; what the adaptive default's top rung does).
    /// A workload whose memory grows through its first steps in blocks of a few pages then
    /// pays one miss per chunk instead of one per block: audio_ctc_train took 0.46–0.50× the
    /// driver pool's time instead of 1.12× on an H200. The pages ahead are mapped only where
    /// the cache budget holds them as idle pages, never in an arena that holds no page, and
    /// never while `whole_chunks_when_growing` cuts a growing block as one chunk.
    pub map_ahead_when_growing: bool,
    /// Whether the settings above (chunk sizes, idle pages, placement) are where the pools
    /// start and move from (`Adaptive`, the default), all they ever use (`Fixed`), or replaced
    /// by the least memory (`MemoryFirst`).
    pub cache_mode: CacheMode,
}

/// The same settings under the name the embedding examples use (`ManagerConfig` next to
/// `MemoryManager`); `MemoryConfig` is the name the configuration guide and presets use.
pub type ManagerConfig = MemoryConfig;

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            strategy: Strategy::Pooled,
            devices: None,
            gpu_memory_fraction: 0.9,
            max_pool_bytes: None,
            min_free_bytes: 512 * MIB,
            cpu_fallback: false,
            track_allocations: true,
            capture_backtraces: false,
            leak_age: Duration::from_secs(600),
            pressure: PressureThresholds::default(),
            trim_on_high_pressure: true,
            cleanup_interval: Some(Duration::from_secs(1)),
            release_idle_after: Some(Duration::from_secs(60)),
            max_cached_bytes: None,
            preallocate_bytes: 0,
            shards: 0,
            small_max_bytes: 64 * KIB,
            idle_pages_kept: 4,
            idle_per_mille: 8,
            max_chunk_bytes: 6 * MIB,
            inside_chunk_bytes: 16 * MIB,
            whole_chunks_when_growing: false,
            make_room_without_waiting: false,
            room_without_waiting_bytes: 256 * MIB,
            stream_ordered_reuse: None,
            place_on_mapped_pages: false,
            map_ahead_when_growing: false,
            cache_mode: CacheMode::Adaptive,
        }
    }
}

impl MemoryConfig {
    /// A serving process: upkeep every 5 s, cache trimmed under pressure, leaks after 10 min.
    pub fn for_inference() -> Self {
        MemoryConfig {
            cleanup_interval: Some(Duration::from_secs(5)),
            ..Self::default()
        }
    }

    /// A small or shared GPU: the pools stay under 80 %, keep little cached, give idle memory
    /// back after 5 s, wait for the GPU rather than hold what it has in flight, and spill to
    /// host memory rather than fail.
    pub fn for_constrained() -> Self {
        MemoryConfig {
            gpu_memory_fraction: 0.8,
            min_free_bytes: GIB,
            cpu_fallback: true,
            cleanup_interval: Some(Duration::from_secs(1)),
            release_idle_after: Some(Duration::from_secs(5)),
            idle_pages_kept: 2,
            idle_per_mille: 4,
            room_without_waiting_bytes: 0,
            ..Self::default()
        }
    }

    /// Development: leaks show after a minute, with the thread and backtrace that made them.
    pub fn development() -> Self {
        MemoryConfig {
            capture_backtraces: true,
            leak_age: Duration::from_secs(60),
            cleanup_interval: Some(Duration::from_secs(1)),
            ..Self::default()
        }
    }

    /// The least memory: the cache's memory-first setting, fixed (see [`CacheMode`]).
    pub fn memory_first() -> Self {
        MemoryConfig {
            cache_mode: CacheMode::MemoryFirst,
            ..Self::default()
        }
    }

    /// Production: as [`for_inference`](Self::for_inference).
    pub fn production() -> Self {
        Self::for_inference()
    }

    /// Tests: no background thread, nothing cached between steps, leaks after a second.
    pub fn testing() -> Self {
        MemoryConfig {
            leak_age: Duration::from_secs(1),
            release_idle_after: Some(Duration::ZERO),
            cleanup_interval: None,
            ..Self::default()
        }
    }

    /// A preset by name: default, inference, constrained, development, production, testing,
    /// memory-first.
    pub fn preset(name: &str) -> Result<Self, ConfigError> {
        match name {
            "default" => Ok(Self::default()),
            "inference" => Ok(Self::for_inference()),
            "constrained" => Ok(Self::for_constrained()),
            "development" => Ok(Self::development()),
            "production" => Ok(Self::production()),
            "testing" => Ok(Self::testing()),
            "memory-first" => Ok(Self::memory_first()),
            other => Err(ConfigError::new(
                "preset",
                format!("unknown preset '{other}' (known: default, inference, constrained, development, production, testing, memory-first)"),
            )),
        }
    }

    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }
    pub fn pooling(self, on: bool) -> Self {
        self.strategy(if on {
            Strategy::Pooled
        } else {
            Strategy::Direct
        })
    }
    pub fn devices(mut self, devices: Vec<usize>) -> Self {
        self.devices = Some(devices);
        self
    }
    pub fn gpu_memory_fraction(mut self, fraction: f64) -> Self {
        self.gpu_memory_fraction = fraction;
        self
    }
    pub fn max_pool_size(mut self, bytes: u64) -> Self {
        self.max_pool_bytes = Some(bytes);
        self
    }
    pub fn min_free_bytes(mut self, bytes: u64) -> Self {
        self.min_free_bytes = bytes;
        self
    }
    pub fn cpu_fallback(mut self, on: bool) -> Self {
        self.cpu_fallback = on;
        self
    }
    pub fn track_allocations(mut self, on: bool) -> Self {
        self.track_allocations = on;
        self
    }
    pub fn capture_backtraces(mut self, on: bool) -> Self {
        self.capture_backtraces = on;
        self
    }
    pub fn leak_age(mut self, age: Duration) -> Self {
        self.leak_age = age;
        self
    }
    pub fn pressure_thresholds(mut self, thresholds: PressureThresholds) -> Self {
        self.pressure = thresholds;
        self
    }
    pub fn max_cached_bytes(mut self, bytes: u64) -> Self {
        self.max_cached_bytes = Some(bytes);
        self
    }
    pub fn cleanup_interval(mut self, interval: Option<Duration>) -> Self {
        self.cleanup_interval = interval;
        self
    }

    /// Checks every value against its range; the error names the first key that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fraction = self.gpu_memory_fraction;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(ConfigError::new(
                "gpu_memory_fraction",
                format!("{fraction} is out of range (0 < value <= 1)"),
            ));
        }
        if self.max_pool_bytes == Some(0) {
            return Err(ConfigError::new(
                "max_pool_size",
                "0 is out of range (at least one page, e.g. 2MiB)",
            ));
        }
        if self.leak_age.is_zero() {
            return Err(ConfigError::new(
                "leak_age",
                "must be longer than zero (e.g. 10m)",
            ));
        }
        if let Some(interval) = self.cleanup_interval {
            if interval < Duration::from_millis(10) {
                return Err(ConfigError::new(
                    "cleanup_interval",
                    format!("{interval:?} is too short (at least 10ms)"),
                ));
            }
        }
        if self.shards > 64 {
            return Err(ConfigError::new(
                "shards",
                format!("{} is out of range (0 to 64)", self.shards),
            ));
        }
        if !(512..=64 * MIB).contains(&self.small_max_bytes) {
            return Err(ConfigError::new(
                "small_max_bytes",
                format!("{} is out of range (512 B to 64 MiB)", self.small_max_bytes),
            ));
        }
        if self.idle_per_mille > 1024 {
            return Err(ConfigError::new(
                "idle_per_mille",
                format!("{} is out of range (0 to 1024)", self.idle_per_mille),
            ));
        }
        if !(MIB..=64 * GIB).contains(&self.max_chunk_bytes) {
            return Err(ConfigError::new(
                "max_chunk_bytes",
                format!(
                    "{} is out of range (1 MiB to 64 GiB; chunks are whole pages, at least one)",
                    self.max_chunk_bytes
                ),
            ));
        }
        if self.inside_chunk_bytes > 64 * GIB {
            return Err(ConfigError::new(
                "inside_chunk_bytes",
                format!(
                    "{} is out of range (0 to 64 GiB; 0, or no more than max_chunk_bytes, for none)",
                    self.inside_chunk_bytes
                ),
            ));
        }
        self.pressure
            .validate()
            .map_err(|message| ConfigError::new("pressure", message))
    }

    /// A power of two, so picking a thread's shard is a mask, not a division.
    pub(crate) fn shard_count(&self) -> usize {
        let wanted = if self.shards > 0 {
            self.shards
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(8)
        };
        1 << wanted.ilog2()
    }

    /// The most the pools of a device with `total` bytes may hold.
    pub fn pool_cap(&self, total: u64) -> u64 {
        let by_fraction = (total as f64 * self.gpu_memory_fraction) as u64;
        self.max_pool_bytes
            .map_or(by_fraction, |cap| cap.min(by_fraction))
    }

    pub(crate) fn pool_settings(&self, device_total: u64) -> PoolSettings {
        PoolSettings {
            small_max: self.small_max_bytes,
            // Twice the device: address space is cheap, and a hole-riddled range must never
            // be what fails an allocation the device could serve.
            span: device_total.saturating_mul(2),
            // The device's cache knobs carry it, so that the adaptive default can move it.
            place_on_mapped_pages: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_differ() {
        for name in [
            "default",
            "inference",
            "constrained",
            "development",
            "production",
            "testing",
            "memory-first",
        ] {
            MemoryConfig::preset(name).unwrap().validate().unwrap();
        }
        assert!(MemoryConfig::for_constrained().cpu_fallback);
        assert!(MemoryConfig::development().capture_backtraces);
        let err = MemoryConfig::preset("turbo").unwrap_err();
        assert!(err.to_string().contains("known: default"), "{err}");
    }

    #[test]
    fn validation_names_the_key_and_range() {
        let err = MemoryConfig::default()
            .gpu_memory_fraction(1.5)
            .validate()
            .unwrap_err();
        assert_eq!(err.key, "gpu_memory_fraction");
        assert!(err.to_string().contains("(0 < value <= 1)"), "{err}");
        let err = MemoryConfig::default()
            .leak_age(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(err.key, "leak_age");
    }

    #[test]
    fn the_pool_cap_is_the_tighter_of_fraction_and_size() {
        let config = MemoryConfig::default();
        assert_eq!(config.pool_cap(10 * GIB), 9 * GIB);
        assert_eq!(config.clone().max_pool_size(GIB).pool_cap(10 * GIB), GIB);
    }
}
