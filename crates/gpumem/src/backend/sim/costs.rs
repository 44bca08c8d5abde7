//! What the simulated driver's calls cost: nothing, or an H100's measured prices, spent by
//! spinning on the calling thread.

use crate::units::MIB;

/// How long the simulated driver's calls take. `Free` answers at once (tests, the demo);
/// `H100` spends, by spinning on the calling thread, what each call cost on an H100 80GB HBM3
/// with driver 580 (`benches/gpu/vmm_probe.c`, medians, docs/gpu-results.md), so that replays
/// and benchmarks on the simulated device show what misses cost on a GPU. A model: per call
/// and per physical chunk, as the driver charges, not the driver itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DriverCosts {
    #[default]
    Free,
    H100,
}

impl crate::named::Named for DriverCosts {
    const CHOICES: &'static [crate::named::Choice<Self>] = &[
        crate::named::Choice::plain("free", DriverCosts::Free),
        crate::named::Choice::plain("h100", DriverCosts::H100),
    ];
}

impl DriverCosts {
    /// Nanoseconds of one call that creates `created` chunks and maps `mapped` chunks (created
    /// ones included), granting access once.
    pub(super) fn map(self, created: u64, mapped: u64) -> u64 {
        match self {
            DriverCosts::Free => 0,
            // cuMemCreate 8 µs; cuMemMap 0.6 µs; cuMemSetAccess 34 µs for one chunk, 158 µs for
            // eight in one call.
            DriverCosts::H100 => created * 8_000 + mapped * 600 + 14_000 + mapped * 20_000,
        }
    }

    /// An unmap of `chunks` chunks. The driver charges per chunk, not per call: on three H100s
    /// (`benches/gpu/unmap_probe.c`), eight chunks took 111–143 µs in one call and 113–144 µs in
    /// eight, thirty-two 432–586 µs either way, one alone 20–25 µs, and pauses of up to a
    /// millisecond between the calls changed nothing beyond the spread.
    pub(super) fn unmap(self, chunks: u64) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => chunks * 18_000,
        }
    }

    /// Releasing one chunk of `bytes` (cuMemRelease: 9.8 µs at 2 MiB, 33 µs at 64 MiB).
    pub(super) fn release(self, bytes: u64) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => 9_000 + bytes / MIB * 375,
        }
    }

    /// cuMemAlloc (42 µs) and cuMemFree (35 µs) on the host these were measured on.
    pub(super) fn direct(self, allocating: bool) -> u64 {
        match (self, allocating) {
            (DriverCosts::Free, _) => 0,
            (DriverCosts::H100, true) => 42_000,
            (DriverCosts::H100, false) => 35_000,
        }
    }

    /// Recording a fence: cuEventRecord and one cuEventQuery took 1.0 µs together on an H100
    /// (`vmm_probe.c`; the cuEventCreate before them was not timed, so this is a floor).
    pub(super) fn fence(self) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => 1_000,
        }
    }

    /// cuStreamSynchronize on an idle stream (0.5 µs).
    pub(super) fn sync(self) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => 500,
        }
    }
}

thread_local! {
    /// The driver time charged to this thread so far, by every simulated device.
    static CHARGED_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The driver time the simulated devices have charged this thread so far.
pub(super) fn charged_ns() -> u64 {
    CHARGED_NS.with(std::cell::Cell::get)
}

/// Spends `ns` nanoseconds on this thread, as a driver call would, and charges them to it.
pub(super) fn spend(ns: u64) {
    if ns == 0 {
        return;
    }
    CHARGED_NS.with(|charged| charged.set(charged.get().wrapping_add(ns)));
    let until = std::time::Instant::now() + std::time::Duration::from_nanos(ns);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}
