//! The text report of `gpumem estimate`: the model and workload, the memory breakdown, a row per
//! device, the workspace lines, the split across devices and the verdict.

use super::Report;
use gpumem::units::Bytes;

pub(super) fn render(report: &Report) -> String {
    let (shape, workload, e) = (&report.shape, &report.workload, &report.estimate);
    let mut out = String::new();
    let model = match (report.model, report.description) {
        (Some(name), Some(description)) => format!("{name} ({description})"),
        _ => "custom shape".to_string(),
    };
    out.push_str(&format!(
        "model        {model}: hidden {}, intermediate {}, {} layers, vocab {}, {} heads \
         ({} KV heads, head dim {}){}\n",
        shape.hidden,
        shape.intermediate,
        shape.layers,
        shape.vocab,
        shape.heads,
        shape.kv_heads,
        report.head_dim,
        if shape.tied_embeddings {
            ", tied embeddings"
        } else {
            ""
        }
    ));
    out.push_str(&format!(
        "workload     batch {} x {} tokens, weights {}, KV cache {}\n",
        workload.batch,
        workload.max_seq,
        workload.weights.name(),
        workload.kv_cache.name()
    ));
    out.push_str(&format!(
        "parameters   {:.2} B\n\n",
        e.parameters as f64 / 1e9
    ));
    for (label, bytes) in [
        ("weights", e.weights_bytes),
        ("KV cache", e.kv_cache_bytes),
        ("activations", e.activation_bytes),
        ("total", e.total_bytes),
    ] {
        out.push_str(&format!(
            "{label:<12} {:>12}  ({bytes} bytes)\n",
            Bytes(bytes).to_string()
        ));
    }
    out.push_str(&format!(
        "\n{:<4} {:<24} {:>12} {:>12} {:>12} {:>5} {:>9} {:>12}\n",
        "GPU", "NAME", "TOTAL", "FREE", "USABLE", "FITS", "MAX BATCH", "LINEAR BATCH"
    ));
    let optional = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |b| Bytes(b).to_string());
    for d in &report.devices {
        let linear = d
            .linear_batch
            .map_or_else(|| "-".to_string(), |b| b.to_string());
        out.push_str(&format!(
            "{:<4} {:<24} {:>12} {:>12} {:>12} {:>5} {:>9} {:>12}\n",
            d.index,
            d.name,
            Bytes(d.total_bytes).to_string(),
            optional(d.free_bytes),
            optional(d.usable_bytes),
            if d.fits { "yes" } else { "no" },
            d.max_batch,
            linear
        ));
        if let Some(error) = &d.mem_info_error {
            out.push_str(&format!("     memory info unavailable: {error}\n"));
        }
    }
    out.push('\n');
    for d in &report.devices {
        match &d.workspace {
            Some(w) => out.push_str(&format!(
                "workspace    GPU {}: {} ({} bytes) for batch {} of the {} layer: {}\n",
                d.index,
                Bytes(w.workspace_bytes),
                w.workspace_bytes,
                w.batch,
                w.layer,
                w.reason
            )),
            None if d.mem_info_error.is_none() => out.push_str(&format!(
                "workspace    GPU {}: none (not one row of the largest linear layer fits in 60 % \
                 of what weights and KV cache leave)\n",
                d.index
            )),
            None => {}
        }
    }
    if let Some(plan) = &report.split {
        out.push('\n');
        out.push_str(&plan.render());
    }
    out.push_str(&format!("\n{}\n", report.verdict));
    out
}
