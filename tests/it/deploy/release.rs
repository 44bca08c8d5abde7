//! The release as code (.github/workflows/release.yml): its version check run for real against
//! the repository's versions, and the workflow read for what a release must publish — the image
//! for amd64 and arm64 from docker/Dockerfile, the chart pushed as an OCI artifact, manylinux_2_28
//! wheels checked on the oldest and newest Python the package claims — every job behind the
//! version check (actionlint checks the workflow's syntax, expressions and shell in .ci/run);
//! and the README's first screen, which until a release starts the Kubernetes path with
//! building and pushing the image.

use super::{documents, read, repo, strings};
use serde_json::Value;
use std::process::Command;

const WORKFLOW: &str = ".github/workflows/release.yml";

fn check_versions(tag: &str) -> (i32, String, String) {
    let output = Command::new(repo(".github/release/check-versions"))
        .arg(tag)
        .output()
        .expect("check-versions runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn workspace_version() -> String {
    let manifest = read("Cargo.toml");
    let section = manifest
        .split("[workspace.package]")
        .nth(1)
        .expect("[workspace.package]");
    let line = section
        .lines()
        .find(|l| l.starts_with("version"))
        .expect("a version");
    line.split('"')
        .nth(1)
        .expect("a quoted version")
        .to_string()
}

#[test]
fn a_tag_releases_only_when_every_version_agrees_with_it() {
    let version = workspace_version();
    let (code, stdout, stderr) = check_versions(&format!("v{version}"));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), format!("version={version}"));
    assert!(stderr.contains("4 places"), "{stderr}");

    let (code, stdout, stderr) = check_versions("v99.0.0");
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty(), "nothing for $GITHUB_OUTPUT: {stdout}");
    assert!(
        stderr.contains("Cargo.toml") && stderr.contains("99.0.0"),
        "{stderr}"
    );
    for bad in ["0.1.0", "v0.1", "release"] {
        let (code, _, stderr) = check_versions(bad);
        assert_eq!(code, 2, "{bad}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
}

fn steps_using<'a>(job: &'a Value, action: &str) -> Vec<&'a Value> {
    job["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["uses"].as_str().is_some_and(|u| u.starts_with(action)))
        .collect()
}

fn runs(job: &Value) -> String {
    job["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_release_publishes_the_image_the_chart_and_the_wheels_behind_the_version_check() {
    let workflow = &documents(&read(WORKFLOW), WORKFLOW)[0];
    // (YAML 1.1 reads the key `on` as true.)
    let trigger = if workflow["on"].is_null() {
        &workflow["true"]
    } else {
        &workflow["on"]
    };
    assert_eq!(
        strings(&trigger["push"]["tags"]),
        ["v[0-9]+.[0-9]+.[0-9]+*"]
    );
    let jobs = workflow["jobs"].as_object().expect("jobs");
    assert!(runs(&jobs["versions"]).contains(".github/release/check-versions \"$GITHUB_REF_NAME\""));
    // Every job waits for the check, directly or through a job that does.
    let waits_for_check = |name: &str| -> bool {
        let mut pending = vec![name.to_string()];
        while let Some(job) = pending.pop() {
            let needs = match &jobs[&job]["needs"] {
                Value::String(one) => vec![one.clone()],
                other => strings(other),
            };
            if needs.iter().any(|n| n == "versions") {
                return true;
            }
            pending.extend(needs);
        }
        false
    };
    for name in jobs.keys().filter(|n| *n != "versions") {
        assert!(
            waits_for_check(name),
            "job {name} runs before the version check"
        );
    }

    let image = &jobs["image"];
    let build = steps_using(image, "docker/build-push-action")[0];
    assert_eq!(build["with"]["file"], "docker/Dockerfile");
    assert_eq!(build["with"]["platforms"], "linux/amd64,linux/arm64");
    assert_eq!(build["with"]["push"], true);
    assert!(!steps_using(image, "docker/setup-qemu-action").is_empty());
    assert!(
        runs(image).contains("healthcheck"),
        "the pushed image is run"
    );

    let chart = runs(&jobs["chart"]);
    assert!(chart.contains("helm package deploy/helm/gpumem"));
    assert!(
        chart.contains("helm push")
            && workflow["env"]["CHARTS"]
                .as_str()
                .is_some_and(|c| c.starts_with("oci://"))
    );

    let wheels = steps_using(&jobs["wheels"], "PyO3/maturin-action")[0];
    assert_eq!(wheels["with"]["manylinux"], "2_28");
    assert!(wheels["with"]["args"]
        .as_str()
        .is_some_and(|a| a.contains("--compatibility manylinux_2_28")));
    assert_eq!(
        strings(&jobs["wheels"]["strategy"]["matrix"]["target"]),
        ["x86_64", "aarch64"]
    );
    // The oldest Python the package claims, and the newest there is.
    let claimed = read("python/pyproject.toml");
    assert!(claimed.contains("requires-python = \">=3.9\""));
    assert_eq!(
        strings(&jobs["wheel-check"]["strategy"]["matrix"]["python"]),
        ["3.9", "3.13"]
    );
    let publish = &jobs["publish-wheels"];
    assert!(!steps_using(publish, "pypa/gh-action-pypi-publish").is_empty());
    assert_eq!(publish["permissions"]["id-token"], "write");
}

/// The README's first screen (before its first `## `): under 60 lines, three commands for each
/// reader, the platform team's starting with the image and passing it to the chart.
#[test]
fn the_readme_s_first_screen_gives_each_reader_three_commands() {
    let readme = read("README.md");
    let screen: Vec<&str> = readme
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .collect();
    assert!(
        screen.len() < 60,
        "the first screen is {} lines",
        screen.len()
    );
    // The commands of each reader's block: the lines of the ```sh block after its label.
    let commands = |reader: &str| -> Vec<String> {
        let at = screen
            .iter()
            .position(|l| l.starts_with(&format!("**{reader}:**")))
            .unwrap_or_else(|| panic!("no block for {reader}"));
        screen[at..]
            .iter()
            .skip_while(|l| **l != "```sh")
            .skip(1)
            .take_while(|l| **l != "```")
            .map(|l| l.to_string())
            .collect()
    };
    for reader in ["PyTorch user", "Platform team", "Rust engine"] {
        assert_eq!(
            commands(reader).len(),
            3,
            "{reader}: {:?}",
            commands(reader)
        );
    }
    let platform = commands("Platform team");
    assert!(platform[0].starts_with("docker build -f docker/Dockerfile -t "));
    assert!(platform[0].contains("&& docker push "));
    assert!(platform[1].contains("pod-security.kubernetes.io/enforce=privileged"));
    assert!(platform[2].starts_with("helm install gpumem deploy/helm/gpumem"));
    assert!(platform[2].contains("--set image.repository="));
    // The two commands CI and a new user run, as they are.
    let rust = commands("Rust engine");
    assert!(rust[0].starts_with("cargo run --release -- demo "));
    assert!(rust[1].starts_with("cargo test --release "));
    assert!(read(".ci/run").contains("\ncargo test --release\n"));
}
