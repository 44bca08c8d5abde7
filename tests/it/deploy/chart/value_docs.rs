//! The chart's values documented: each one in values.yaml has a `# --` comment there and a row in
//! the README's table, and each row names a value that exists.

use crate::deploy::{read, CHART};

/// The values of values.yaml a user sets, as dotted paths: a key whose comment starts with
/// `# --` is one value (whatever it holds); a key without is a section of values, and one
/// holding a value on its own line is a value nobody commented (the second list).
fn documented_values() -> (Vec<String>, Vec<String>) {
    let text = read(&format!("{CHART}/values.yaml"));
    let lines: Vec<&str> = text.lines().collect();
    let mut values = Vec::new();
    let mut uncommented = Vec::new();
    let mut sections: Vec<(usize, String)> = Vec::new();
    let mut inside_value: Option<usize> = None;
    for (at, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if inside_value.is_some_and(|outer| indent > outer) {
            continue;
        }
        inside_value = None;
        let Some((key, rest)) = trimmed.split_once(':') else {
            continue;
        };
        sections.retain(|(depth, _)| *depth < indent);
        let path: Vec<&str> = sections
            .iter()
            .map(|(_, name)| name.as_str())
            .chain([key])
            .collect();
        let path = path.join(".");
        // The comment block right above the key.
        let comment = lines[..at]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with('#'))
            .last()
            .map_or("", |l| l.trim());
        if comment.starts_with("# --") {
            values.push(path);
            inside_value = Some(indent);
        } else if rest.trim().is_empty() {
            sections.push((indent, key.to_string()));
        } else {
            uncommented.push(path);
            inside_value = Some(indent);
        }
    }
    (values, uncommented)
}

/// Every value in values.yaml has a comment there and a row in the README's table, and every
/// row names a value that exists.
#[test]
fn every_value_is_commented_and_documented() {
    let (values, uncommented) = documented_values();
    assert!(
        uncommented.is_empty(),
        "values without a `# --` comment: {uncommented:?}"
    );
    assert!(
        values.len() >= 40,
        "only {} values found: {values:?}",
        values.len()
    );
    for must in [
        "nodeAgent.hostPID",
        "nodeAgent.collectDir.enabled",
        "sidecar.resources",
    ] {
        assert!(
            values.iter().any(|v| v == must),
            "{must} is not a commented value"
        );
    }
    let readme = read(&format!("{CHART}/README.md"));
    let rows: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name))
        .collect();
    for value in &values {
        assert!(
            rows.contains(&value.as_str()),
            "README.md does not document {value}"
        );
    }
    for row in &rows {
        assert!(
            values.iter().any(|v| v == row),
            "README.md documents {row}, which values.yaml lacks"
        );
    }
}
