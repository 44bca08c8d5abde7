//! Figures quoted in the docs are what this build prints: each replay figure in
//! docs/configuration.md is checked against `GPUMEM_CACHE_MODE=fixed gpumem replay --backend sim
//! --json` on the traces in benches/traces (the configured keys' defaults, which that section
//! explains), so a change to the allocator that moves them fails here until the docs say the
//! new numbers.

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
    let out = gpumem(&args)
        .env("GPUMEM_CACHE_MODE", "fixed")
        .output()
        .expect("gpumem runs");
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

/// Every key the configuration parser takes appears in docs/configuration.md as a line of its
/// example file (`key = …`, or under `[pressure]` for `pressure.*`), and the example names no
/// key the parser would refuse.
#[test]
fn the_configuration_doc_names_every_key_the_parser_takes() {
    let doc = include_str!("../../docs/configuration.md");
    let keys: Vec<&str> = gpumem::manager::config_keys().collect();
    let documented = |key: &str| {
        let name = key.rsplit('.').next().unwrap_or(key);
        doc.lines()
            .any(|line| line.trim_start().starts_with(&format!("{name} =")))
    };
    let missing: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|key| !documented(key))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not show {missing:?}"
    );
    let mut section = String::new();
    for line in doc.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.starts_with("```") {
            section.clear(); // each example file starts at the top level
            continue;
        }
        if line.starts_with('[') && line.ends_with(']') {
            section = line.trim_matches(['[', ']']).to_string();
            continue;
        }
        let Some((name, _)) = line.split_once(" = ") else {
            continue;
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        let key = match section.as_str() {
            "" => name.to_string(),
            table => format!("{table}.{name}"),
        };
        assert!(
            keys.contains(&key.as_str()),
            "docs/configuration.md shows `{key}`, which the parser does not know"
        );
    }
}
