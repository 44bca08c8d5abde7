//! The container files checked against the binary (the image itself is built and run in
//! deploy::image), and the helpers the Kubernetes and compose checks share: every YAML under
//! docker/ parses; the Dockerfile is multi-stage, non-root, exposes 9400 and checks /healthz;
//! the flags the files pass are flags the binary takes; and the commands they run, started here
//! for real, serve /healthz and /metrics where the probes and scrapers look.

use super::TempDir;
use crate::support::{gpumem, Running};
use crate::web::get;
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

pub(super) const PORT: i64 = 9400;
pub(super) const PUBLISH_DIR: &str = "/run/gpumem";

pub(super) fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub(super) fn read(relative: &str) -> String {
    std::fs::read_to_string(repo(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

pub(super) fn yaml(relative: &str) -> Vec<Yaml> {
    let docs = YamlLoader::load_from_str(&read(relative))
        .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"));
    assert!(
        !docs.is_empty() && !docs[0].is_null(),
        "{relative} is empty"
    );
    docs
}

pub(super) fn text(value: &Yaml) -> String {
    match value {
        Yaml::String(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

pub(super) fn strings(value: &Yaml) -> Vec<String> {
    value
        .as_vec()
        .map_or_else(Vec::new, |v| v.iter().map(text).collect())
}

/// Runs `gpumem <args> --help`: clap refuses an unknown flag before printing help, and the
/// help must list each flag used, so both a typo and a removed flag fail here.
pub(crate) fn assert_flags_parse(args: &[String]) {
    let output = gpumem(&[]).args(args).arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "gpumem {args:?} does not parse: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        let flag = flag.split('=').next().unwrap_or(flag);
        assert!(
            help.split_whitespace().any(|w| w == flag),
            "`gpumem {}` does not document {flag}:\n{help}",
            args[0]
        );
    }
}

/// The value after `flag` in an argument list.
pub(crate) fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

/// Starts the command a container would run, on a free port and a temporary directory, and
/// checks what probes and scrapers ask for.
pub(crate) fn assert_serves_probes(args: &[String], dir: &TempDir) -> Running {
    let local: Vec<String> = args
        .iter()
        .map(|a| match a.as_str() {
            "0.0.0.0:9400" => "127.0.0.1:0".to_string(),
            PUBLISH_DIR => dir.str().to_string(),
            other => other.to_string(),
        })
        .collect();
    let mut with_sim = local.clone();
    // Off the GPU: the demo's auto backend would pick CUDA on a GPU host, which is fine, but
    // the simulated device keeps the test quick everywhere.
    if with_sim[0] == "demo" {
        with_sim.extend(["--backend".to_string(), "sim".to_string()]);
    }
    let refs: Vec<&str> = with_sim.iter().map(String::as_str).collect();
    let running = Running::start(&refs);
    assert_eq!(get(running.addr, "/healthz").status, 200, "{args:?}");
    let metrics = get(running.addr, "/metrics");
    assert_eq!(metrics.status, 200, "{args:?}");
    assert!(metrics.body.contains("gpumem_up"), "{args:?}");
    running
}

struct Instruction {
    keyword: String,
    rest: String,
}

fn dockerfile() -> Vec<Instruction> {
    let text = read("docker/Dockerfile");
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        joined.push(std::mem::take(&mut current));
    }
    joined
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (keyword, rest) = line.split_once(' ').unwrap_or((&line, ""));
            Instruction {
                keyword: keyword.to_ascii_uppercase(),
                rest: rest.trim().to_string(),
            }
        })
        .collect()
}

fn json_array(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not a JSON array ({e}): {text}"))
}

#[test]
fn the_dockerfile_builds_a_slim_non_root_image_that_checks_its_health() {
    let instructions = dockerfile();
    let all = |keyword: &str| -> Vec<&str> {
        instructions
            .iter()
            .filter(|i| i.keyword == keyword)
            .map(|i| i.rest.as_str())
            .collect()
    };
    // Bases come from ARGs whose defaults name them in full (a daemonless builder with no
    // search registry refuses short names); --build-arg swaps in a local base.
    let args: Vec<(&str, &str)> = all("ARG")
        .iter()
        .filter_map(|a| a.split_once('='))
        .collect();
    let base = |from: &str| -> String {
        let image = from.split_whitespace().next().unwrap_or("");
        match image.strip_prefix("${").and_then(|i| i.strip_suffix('}')) {
            Some(arg) => args
                .iter()
                .find(|(name, _)| *name == arg)
                .unwrap_or_else(|| panic!("FROM {from}: no ARG {arg} with a default"))
                .1
                .to_string(),
            None => image.to_string(),
        }
    };
    let from = all("FROM");
    assert!(from.len() >= 2, "multi-stage: {from:?}");
    assert!(from[0].ends_with(" AS builder"), "{from:?}");
    assert!(
        base(from[0]).starts_with("docker.io/library/rust:"),
        "{from:?}"
    );
    assert_eq!(
        base(from[1]),
        "docker.io/library/debian:bookworm-slim",
        "{from:?}"
    );
    // The default target (the last stage) is the runtime with the builder's binary.
    assert_eq!(from.last().copied(), Some("runtime-base AS runtime"));
    assert!(
        all("COPY")
            .last()
            .is_some_and(|c| c.starts_with("--from=builder ")),
        "{:?}",
        all("COPY")
    );

    // Build-stage copies come from the repository and get past the context filter.
    let ignore = read("docker/Dockerfile.dockerignore");
    let allowed: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    // (`COPY gpumem` is the target `prebuilt`'s, from a context holding only the binary.)
    for copy in all("COPY")
        .iter()
        .filter(|c| !c.starts_with("--from") && !c.starts_with("gpumem "))
    {
        let parts: Vec<&str> = copy.split_whitespace().collect();
        for source in &parts[..parts.len() - 1] {
            assert!(
                repo(source).exists(),
                "COPY {source}: no such path in the repository"
            );
            assert!(
                allowed.contains(source),
                "COPY {source} is excluded by the .dockerignore"
            );
        }
    }
    // Cargo needs every declared bench target to exist.
    assert!(repo("benches").is_dir());

    let user = all("USER");
    let final_user = user.last().expect("a USER");
    assert!(
        !["root", "0", "0:0"].contains(final_user),
        "runs as {final_user}"
    );
    assert!(final_user
        .split(':')
        .all(|id| id.parse::<u32>().is_ok_and(|n| n > 0)));
    assert_eq!(all("EXPOSE"), [PORT.to_string().as_str()]);
    let env = all("ENV").join(" ");
    assert!(env.contains("NVIDIA_VISIBLE_DEVICES=all"), "{env}");
    assert!(
        env.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
        "{env}"
    );
    assert_eq!(json_array(all("ENTRYPOINT")[0]), ["/usr/local/bin/gpumem"]);

    let command = json_array(all("CMD").last().expect("a CMD"));
    assert_eq!(command[0], "serve");
    assert!(env.contains("GPUMEM_LISTEN=0.0.0.0:9400"), "{env}");
    assert_eq!(
        flag_value(&command, "--listen"),
        None,
        "the address comes from GPUMEM_LISTEN, so the health check can follow it"
    );
    assert_eq!(flag_value(&command, "--collect-dir"), Some(PUBLISH_DIR));
    assert_flags_parse(&command);

    let health = all("HEALTHCHECK");
    let check = health[0]
        .split_once("CMD ")
        .expect("HEALTHCHECK ... CMD [...]")
        .1;
    let check = json_array(check);
    assert_eq!(check[..2], ["/usr/local/bin/gpumem", "healthcheck"]);
    assert_eq!(
        flag_value(&check, "--url"),
        None,
        "the URL follows GPUMEM_LISTEN"
    );
    assert_flags_parse(&check[1..]);

    // The image's command, run here (GPUMEM_LISTEN as a flag): it serves the probes, and the
    // health check, told the address only through GPUMEM_LISTEN, passes on it.
    let dir = TempDir::new("docker-cmd");
    let mut listening = command.clone();
    listening.extend(["--listen".to_string(), "0.0.0.0:9400".to_string()]);
    let running = assert_serves_probes(&listening, &dir);
    let output = gpumem(&[])
        .args(&check[1..])
        .env("GPUMEM_LISTEN", format!("0.0.0.0:{}", running.addr.port()))
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "the HEALTHCHECK fails against the image's own command: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn every_yaml_file_under_docker_parses() {
    let mut found = 0;
    let mut pending = vec![repo("docker")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("list") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                let relative = path
                    .strip_prefix(repo(""))
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned();
                yaml(&relative);
                found += 1;
            }
        }
    }
    assert!(
        found >= 6,
        "compose, prometheus and the k8s manifests: {found}"
    );
}
