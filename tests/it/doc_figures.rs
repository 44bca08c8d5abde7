//! Figures quoted in the docs are what this build prints: each replay figure in
//! docs/configuration.md is checked against `gpumem replay --backend sim --json` on the traces
//! in benches/traces, so a change to the allocator that moves them fails here until the docs
//! say the new numbers.

use crate::support::gpumem;
use std::path::Path;

#[test]
fn the_replay_figures_in_the_configuration_doc_are_reproduced() {
    let doc = include_str!("../../docs/configuration.md");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces");
    let mut traces: Vec<_> = std::fs::read_dir(&dir)
        .expect("benches/traces")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.to_string_lossy().ends_with(".trace.gz"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 2, "traces in {}", dir.display());
    let mut args = vec!["replay", "--backend", "sim", "--json"];
    let paths: Vec<String> = traces.iter().map(|p| p.display().to_string()).collect();
    args.extend(paths.iter().map(String::as_str));
    let out = gpumem(&args).output().expect("gpumem runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut checked = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object a line");
        let trace = v["trace"].as_str().expect("trace name");
        for (key, field) in [
            ("`pool_hit_ratio`", "pool_hit_ratio"),
            ("`reserved_over_peak`", "reserved_over_peak"),
        ] {
            let figure = format!("{trace} {:.4}", v[field].as_f64().expect("a number"));
            let quoted = &doc[doc.find(key).expect("the figure's key in the doc")..];
            let quoted = &quoted[..quoted.find(')').expect("end of the list")];
            assert!(
                quoted.contains(&figure),
                "docs/configuration.md should quote {figure} in {quoted:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * traces.len());
}
