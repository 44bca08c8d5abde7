//! Bad input, table-driven, over everything the binary reads: flags and their `GPUMEM_*`
//! variables (`flags`), config files and variables (`config`), trace files (`traces`) and the
//! files a sidecar collects (`collect`). Every case must end with the documented exit code (2
//! bad input, 1 a failure while running), one short line on stderr naming the problem, nothing
//! on stdout, no panic, and no output file left behind. This file holds the table runner.

mod collect;
mod config;
mod flags;
mod traces;

use super::{gpumem, Scratch};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// One row of the table.
pub(super) struct Case {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    code: i32,
    /// Must appear in stderr (case-sensitive).
    needle: String,
    /// A file the command was asked to write, which must not exist afterwards.
    output: Option<PathBuf>,
}

pub(super) fn case(name: &str, args: &[&str], code: i32, needle: &str) -> Case {
    Case {
        name: name.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        code,
        needle: needle.to_string(),
        output: None,
    }
}

impl Case {
    pub(super) fn env(mut self, key: &str, value: &str) -> Case {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub(super) fn output(mut self, path: PathBuf) -> Case {
        self.output = Some(path);
        self
    }
}

/// A command and the flags it always gets (a simulated backend; for the demo, a bounded run on
/// a free port, so a row that is wrongly accepted still ends); an empty value is a bare flag.
pub(super) struct Base {
    pub(super) command: &'static str,
    pub(super) flags: &'static [(&'static str, &'static str)],
}

impl Base {
    /// The command and its flags, as a command line.
    pub(super) fn args(&self) -> Vec<&'static str> {
        let mut args = vec![self.command];
        args.extend(self.flags.iter().flat_map(|&(flag, value)| [flag, value]));
        args
    }
}

pub(super) const DEVICES: Base = Base {
    command: "devices",
    flags: &[("--backend", "sim")],
};
pub(super) const DEMO: Base = Base {
    command: "demo",
    flags: &[
        ("--backend", "sim"),
        ("--duration", "3s"),
        ("--listen", "127.0.0.1:0"),
    ],
};

pub(super) const SERVE: Base = Base {
    command: "serve",
    flags: &[("--backend", "sim"), ("--listen", "127.0.0.1:0")],
};

/// The same bad value through a flag (`--flag=value`, so negative numbers stay values) and
/// through its variable: two rows. The base's own value for that flag is left out.
pub(super) fn flag_and_env(
    base: &Base,
    extra: &[&str],
    flag: &str,
    variable: &str,
    value: &str,
    code: i32,
    needle: &str,
) -> [Case; 2] {
    let mut args = vec![base.command.to_string()];
    for (name, default) in base.flags.iter().filter(|(name, _)| *name != flag) {
        args.push(name.to_string());
        if !default.is_empty() {
            args.push(default.to_string());
        }
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut with_flag = args.clone();
    let joined = format!("{flag}={value}");
    with_flag.push(&joined);
    [
        case(
            &format!("{} {joined:?}", base.command),
            &with_flag,
            code,
            needle,
        ),
        // Set through its variable, the error names the variable where it named the flag.
        case(
            &format!("{} {variable}={value:?}", base.command),
            &args,
            code,
            &needle.replace(&format!("{flag}:"), &format!("{variable}:")),
        )
        .env(variable, value),
    ]
}

/// Runs one case and returns what was wrong with the outcome, if anything.
fn verdict(case: &Case, out: &Output) -> Option<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut wrong = Vec::new();
    if out.status.code() != Some(case.code) {
        wrong.push(format!(
            "exit {:?}, expected {}",
            out.status.code(),
            case.code
        ));
    }
    if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
        wrong.push("it panicked".to_string());
    }
    if !stderr.contains(&case.needle) {
        wrong.push(format!("stderr does not name {:?}", case.needle));
    }
    // clap reports its own parse errors as "error: ..." with a usage hint; everything else is
    // one line of ours.
    if stderr.starts_with("error:") || stderr.starts_with("GPU memory you can see") {
        if case.code != 2 {
            wrong.push("a parse error must exit 2".to_string());
        }
    } else if !(stderr.starts_with("gpumem: ") && stderr.trim_end().lines().count() == 1) {
        wrong.push("stderr is not one 'gpumem: ...' line".to_string());
    }
    if stderr.len() > 2100 {
        wrong.push(format!("stderr is {} bytes long", stderr.len()));
    }
    if !stdout.is_empty() {
        wrong.push(format!("stdout is not empty: {stdout:.200}"));
    }
    if let Some(path) = &case.output {
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        if path.exists() || PathBuf::from(temp).exists() {
            wrong.push(format!("{} was written", path.display()));
        }
    }
    (!wrong.is_empty()).then(|| {
        format!(
            "{}: {}\n    args {:?} env {:?}\n    stderr: {}",
            case.name,
            wrong.join("; "),
            case.args,
            case.env,
            stderr.trim_end()
        )
    })
}

/// The longest any case may run (a demo row that is wrongly accepted stops after 3 s).
const LIMIT: Duration = Duration::from_secs(30);

/// Runs one case's command; `None` (after killing it) if it outlives [`LIMIT`].
fn run_bounded(case: &Case) -> Option<Output> {
    let mut command = gpumem();
    command.args(&case.args);
    for (key, value) in &case.env {
        command.env(key, value);
    }
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gpumem binary runs");
    let pid = child.id();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || sender.send(child.wait_with_output()));
    match receiver.recv_timeout(LIMIT) {
        Ok(out) => Some(out.expect("wait for gpumem")),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            None
        }
    }
}

/// Runs every case (a few at a time) and fails listing each case that went wrong.
pub(super) fn run_table(cases: Vec<Case>) {
    assert!(!cases.is_empty());
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = cases
            .chunks(cases.len().div_ceil(4))
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|case| match run_bounded(case) {
                            Some(out) => verdict(case, &out),
                            None => Some(format!("{}: still running after {LIMIT:?}", case.name)),
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker thread"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} bad-input cases went wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Files the cases read, in one scratch directory.
pub(super) struct Files {
    pub(super) dir: Scratch,
}

impl Files {
    pub(super) fn new() -> Files {
        let dir = Scratch::new("bad-input");
        Files { dir }
    }

    pub(super) fn write(&self, name: &str, contents: &[u8]) -> String {
        self.dir.file(name, contents).display().to_string()
    }

    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
