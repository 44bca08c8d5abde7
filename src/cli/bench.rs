//! `gpumem bench`: allocation latency of gpumem and the driver's allocators, side by side.

use super::{CliError, CommonArgs, Given};
use crate::bench::{measure, Allocator, BenchTarget};
use clap::Args;
use gpumem::units::{parse_bytes, Bytes};
use std::time::Duration;

#[derive(Args, Debug)]
pub(super) struct BenchArgs {
    /// Allocators to time (comma-separated): pool-hit, pool-miss (kept pages mapped again),
    /// pool-miss-cold (new pages created), driver (cuMemAlloc), driver-async (the driver's
    /// stream-ordered pool), driver-async-miss (that pool trimmed after every free, so each
    /// allocation grows it: its own miss, beside pool-miss-cold). The two driver-async ones
    /// need the CUDA backend and are skipped without it.
    #[arg(
        long,
        env = "GPUMEM_BENCH_ALLOCATORS",
        value_enum,
        value_delimiter = ',',
        default_value = "pool-hit,pool-miss,pool-miss-cold,driver,driver-async,driver-async-miss"
    )]
    allocators: Vec<Allocator>,

    /// Request sizes (comma-separated byte sizes).
    #[arg(
        long,
        env = "GPUMEM_BENCH_SIZES",
        value_delimiter = ',',
        default_value = "256,64KiB,1MiB,16MiB,256MiB"
    )]
    sizes: Vec<String>,

    /// Thread counts to run each case with (comma-separated).
    #[arg(
        long,
        env = "GPUMEM_BENCH_THREADS",
        value_delimiter = ',',
        default_value = "1,8"
    )]
    threads: Vec<usize>,

    /// Most alloc + free pairs per thread and case.
    #[arg(long, env = "GPUMEM_BENCH_ITERATIONS", default_value_t = 20_000)]
    iterations: u64,

    /// Most wall time per case, in seconds (slow driver calls stop early).
    #[arg(long, env = "GPUMEM_BENCH_SECONDS", default_value_t = 2.0)]
    seconds: f64,

    /// Device to run on.
    #[arg(long, env = "GPUMEM_DEVICE", default_value_t = 0)]
    device: usize,

    /// Print one JSON object per case instead of a table.
    #[arg(long, env = "GPUMEM_JSON")]
    json: bool,

    #[command(flatten)]
    common: CommonArgs,
}

pub(super) fn run(args: BenchArgs, given: &Given) -> Result<(), CliError> {
    let sizes = args
        .sizes
        .iter()
        .map(|s| match parse_bytes(s) {
            Ok(0) => Err(CliError::usage("--sizes: a size must be greater than zero")),
            Ok(size) => Ok(size),
            Err(e) => Err(CliError::usage(format!("--sizes: {e}"))),
        })
        .collect::<Result<Vec<u64>, _>>()?;
    if let Some(bad) = args.threads.iter().find(|&&t| t == 0 || t > 256) {
        return Err(CliError::usage(format!(
            "--threads: {bad} is out of range (1 to 256)"
        )));
    }
    if args.iterations == 0 {
        return Err(CliError::usage("--iterations: must be at least 1"));
    }
    let budget = Duration::try_from_secs_f64(args.seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            CliError::usage(format!(
                "--seconds: {} is not a positive number of seconds",
                args.seconds
            ))
        })?;
    let config = args.common.memory_config()?;
    let (opened, selected) = args.common.open_checked(&config, given)?;
    // --device when given, else the first device the file (or --devices) selects.
    let device = match selected.first() {
        Some(&first) if !given.explicit("device") && config.devices.is_some() => first,
        _ => args.device,
    };
    if device >= opened.backend.device_count() {
        return Err(CliError::usage(format!(
            "--device: device {device} does not exist ({} device(s) present)",
            opened.backend.device_count()
        )));
    }
    // A size the device cannot hold would fail half-way through the table, after lines on
    // stdout: refuse it before anything is printed.
    let total = opened
        .backend
        .properties(device)
        .map_err(|e| CliError::runtime(e.to_string()))?
        .total_memory_bytes;
    if let Some(&size) = sizes.iter().find(|&&size| size > total) {
        return Err(CliError::usage(format!(
            "--sizes: {} can never fit on device {device}, which has {} in total",
            Bytes(size),
            Bytes(total)
        )));
    }
    // gpumem's own allocators also stop at the pools' cap (gpu_memory_fraction,
    // max_pool_size): a size past it would fail the same way, half-way through the table.
    let cap = config.pool_cap(total);
    let pooled = args.allocators.iter().any(|a| a.is_gpumem());
    if let Some(&size) = sizes.iter().find(|&&size| pooled && size > cap) {
        return Err(CliError::usage(format!(
            "--sizes: {} is more than gpumem's pools on device {device} may hold ({} of {}: \
             gpu_memory_fraction / max_pool_size); give a smaller size or only the driver \
             allocators",
            Bytes(size),
            Bytes(cap),
            Bytes(total)
        )));
    }
    let mut target = BenchTarget::new(opened.backend, device);
    target.config = config;
    if !args.json {
        println!(
            "{:<17} {:>10} {:>7} {:>12} {:>12} {:>10} {:>6} {:>11}  WHERE",
            "ALLOCATOR", "SIZE", "THREADS", "MEDIAN", "P99", "OPS", "BATCH", "IN DRIVER"
        );
    }
    for &allocator in &args.allocators {
        if allocator.is_stream_ordered() && target.stream_ordered.is_none() {
            eprintln!(
                "gpumem bench: skipping {} (needs the CUDA backend)",
                allocator_name(allocator)
            );
            continue;
        }
        for &size in &sizes {
            for &threads in &args.threads {
                let result = measure(&target, allocator, size, threads, args.iterations, budget)
                    .map_err(|e| {
                        CliError::runtime(format!("{allocator:?} at {}: {e}", Bytes(size)))
                    })?;
                if args.json {
                    let line = serde_json::to_string(&result)
                        .map_err(|e| CliError::runtime(format!("could not encode JSON: {e}")))?;
                    println!("{line}");
                } else {
                    let in_driver = match result.driver_ns_per_pair {
                        Some(ns) => format!("{ns:.0} ns"),
                        None => "–".to_string(),
                    };
                    println!(
                        "{:<17} {:>10} {:>7} {:>9.0} ns {:>9.0} ns {:>10} {:>6} {:>11}  {}",
                        allocator_name(allocator),
                        Bytes(size).to_string(),
                        threads,
                        result.median_ns,
                        result.p99_ns,
                        result.operations,
                        result.pairs_per_sample,
                        in_driver,
                        result.driver_breakdown()
                    );
                }
            }
        }
    }
    Ok(())
}

/// The allocator's name as `--allocators` and the JSON spell it.
fn allocator_name(allocator: Allocator) -> String {
    serde_json::to_value(allocator)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
