//! `gpumem devices`: what each device is, and how much of its memory is free.

use super::{CliError, CommonArgs, Given};
use clap::Args;
use gpumem::backend::{DeviceBackend, DeviceProperties};
use gpumem::units::Bytes;
use serde::Serialize;

#[derive(Args, Debug)]
pub(super) struct DevicesArgs {
    /// Print JSON (an array, one object per device) instead of a table.
    #[arg(long, env = "GPUMEM_JSON")]
    json: bool,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Serialize)]
struct DeviceReport {
    #[serde(flatten)]
    properties: DeviceProperties,
    free_bytes: Option<u64>,
    used_bytes: Option<u64>,
    /// Why free/used are missing, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_info_error: Option<String>,
}

pub(super) fn run(args: DevicesArgs, given: &Given) -> Result<(), CliError> {
    let config = args.common.memory_config()?;
    let (opened, selected) = args.common.open_checked(&config, given)?;
    let backend = opened.backend;
    let reports = selected
        .into_iter()
        .map(|index| report(&*backend, index))
        .collect::<Result<Vec<_>, _>>()?;
    if args.json {
        let text = serde_json::to_string_pretty(&reports)
            .map_err(|e| CliError::runtime(format!("could not encode JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render_table(&reports));
    }
    Ok(())
}

fn report(backend: &dyn DeviceBackend, index: usize) -> Result<DeviceReport, CliError> {
    let properties = backend
        .properties(index)
        .map_err(|e| CliError::runtime(format!("device {index}: {e}")))?;
    let (free_bytes, used_bytes, mem_info_error) = match backend.mem_info(index) {
        Ok(info) => (Some(info.free), Some(info.used()), None),
        Err(error) => (None, None, Some(error.to_string())),
    };
    Ok(DeviceReport {
        properties,
        free_bytes,
        used_bytes,
        mem_info_error,
    })
}

fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

fn optional_bytes(value: Option<u64>) -> String {
    value.map_or_else(|| "?".to_string(), |v| Bytes(v).to_string())
}

fn render_table(reports: &[DeviceReport]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<4} {:<28} {:<41} {:>12} {:>12} {:>12} {:>5} {:>5}\n",
        "GPU", "NAME", "UUID", "TOTAL", "FREE", "USED", "CC", "SMS"
    ));
    for r in reports {
        let p = &r.properties;
        let name = if p.simulated {
            format!("{} (simulated)", p.name)
        } else {
            p.name.clone()
        };
        out.push_str(&format!(
            "{:<4} {:<28} {:<41} {:>12} {:>12} {:>12} {:>5} {:>5}\n",
            p.index,
            name,
            p.uuid,
            Bytes(p.total_memory_bytes).to_string(),
            optional_bytes(r.free_bytes),
            optional_bytes(r.used_bytes),
            format!("{}.{}", p.compute_capability.0, p.compute_capability.1),
            p.multiprocessor_count
        ));
    }
    for r in reports {
        let p = &r.properties;
        out.push_str(&format!("\nGPU {} details\n", p.index));
        let rows = [
            (
                "threads per block / per SM",
                format!(
                    "{} / {}",
                    p.max_threads_per_block, p.max_threads_per_multiprocessor
                ),
            ),
            (
                "shared memory per block",
                Bytes(p.shared_memory_per_block_bytes).to_string(),
            ),
            (
                "constant memory",
                Bytes(p.total_constant_memory_bytes).to_string(),
            ),
            (
                "memory clock / bus width",
                format!(
                    "{} MHz / {} bit",
                    p.memory_clock_khz / 1000,
                    p.memory_bus_width_bits
                ),
            ),
            (
                "unified addressing",
                yes_no(p.unified_addressing).to_string(),
            ),
            (
                "fp16 / bf16",
                format!("{} / {}", yes_no(p.supports_fp16), yes_no(p.supports_bf16)),
            ),
            (
                "stream-ordered memory pools",
                yes_no(p.memory_pools_supported).to_string(),
            ),
            (
                "virtual memory management",
                yes_no(p.virtual_memory_supported).to_string(),
            ),
            (
                "allocation granularity",
                Bytes(p.allocation_granularity_bytes).to_string(),
            ),
        ];
        for (label, value) in rows {
            out.push_str(&format!("  {label:<30} {value}\n"));
        }
        if let Some(error) = &r.mem_info_error {
            out.push_str(&format!("  {:<30} {error}\n", "memory info unavailable"));
        }
    }
    out
}
