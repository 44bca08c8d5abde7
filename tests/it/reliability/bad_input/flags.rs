//! Bad flags and their `GPUMEM_*` variables, every command: garbage, negative, zero, huge,
//! wrong unit, unknown device or address, and parse errors (no command, unknown flag).

use super::{case, flag_and_env, run_table, Base, Case, Files, DEMO, DEVICES, SERVE};

/// `(flag, value, what stderr must name)` for one command, each through the flag and through
/// `GPUMEM_<FLAG>`; all exit 2.
type Rows<'a> = &'a [(&'a str, &'a str, &'a str)];

fn rows(base: &Base, extra: &[&str], rows: Rows, code: i32, cases: &mut Vec<Case>) {
    for &(flag, value, needle) in rows {
        let variable = format!(
            "GPUMEM_{}",
            flag.trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase()
        );
        cases.extend(flag_and_env(
            base, extra, flag, &variable, value, code, needle,
        ));
    }
}

const DEVICES_ROWS: Rows = &[
    ("--backend", "tpu", "tpu"),
    ("--backend", "", "--backend"),
    ("--devices", "zero", "--devices: 'zero'"),
    ("--devices", "7", "device 7 does not exist"),
    ("--devices", "-1", "--devices"),
    ("--devices", "0,,1", "--devices"),
    ("--devices", "99999999999999999999999", "--devices"),
    ("--sim-memory", "lots", "--sim-memory"),
    ("--sim-memory", "-4G", "--sim-memory"),
    ("--sim-memory", "0", "too small"),
    ("--sim-memory", "512MiB", "too small"),
    ("--sim-memory", "12 parsecs", "unknown unit"),
    ("--sim-memory", "1e3G", "unknown unit"),
    ("--sim-memory", "NaN", "--sim-memory"),
    ("--sim-memory", "40T", "too large"),
    ("--sim-memory", "99999999999T", "too large"),
    ("--sim-devices", "0", "--sim-devices"),
    ("--sim-devices", "65", "out of range"),
    ("--sim-devices", "-1", "--sim-devices"),
    ("--sim-devices", "two", "--sim-devices"),
    ("--sim-devices", "99999999999999999999", "--sim-devices"),
];

const DEMO_ROWS: Rows = &[
    ("--listen", "localhost", "--listen"),
    ("--listen", "127.0.0.1:99999", "--listen"),
    ("--listen", ":9400", "--listen"),
    ("--listen", "", "--listen"),
    ("--interval", "10ms", "shortest interval"),
    ("--interval", "0s", "--interval"),
    ("--interval", "-1s", "--interval"),
    ("--interval", "5", "needs a unit"),
    ("--interval", "soon", "--interval"),
    ("--interval", "3 weeks", "unknown unit"),
    ("--interval", "99999999999999999999h", "out of range"),
    ("--duration", "5", "--duration"),
    ("--duration", "-5s", "--duration"),
    ("--duration", "forever", "--duration"),
    ("--leak-age", "old", "--leak-age"),
    ("--spike-at", "later", "--spike-at"),
    ("--spike-at", "-1s", "--spike-at"),
    (
        "--scenario",
        "loud",
        "'loud' is not a scenario; give one of calm, alerts",
    ),
];

const SERVE_ROWS: Rows = &[
    (
        "--collect-dir",
        "/nonexistent/collect",
        "/nonexistent/collect does not exist",
    ),
    ("--interval", "50ms", "shortest interval"),
    ("--listen", "nowhere", "--listen"),
];

const REPLAY_ROWS: Rows = &[
    ("--strategy", "magic", "magic"),
    ("--device", "3", "device 3 does not exist"),
    ("--device", "-1", "--device"),
    ("--idle-pages", "-3", "--idle-pages"),
    ("--idle-pages", "99999999999999999999", "--idle-pages"),
    // GPUMEM_IDLE_PER_MILLE is also the variable of the configuration key idle_per_mille,
    // whose error names the key: both name the value and its range.
    (
        "--idle-per-mille",
        "5000",
        "5000 is out of range (0 to 1024)",
    ),
    ("--plot", "/nonexistent/dir/x.svg", "does not exist"),
    ("--plot", "/tmp", "is a directory"),
];

#[test]
fn bad_flags_and_variables_exit_2_with_one_line() {
    let files = Files::new();
    let trace = files.write("ok.trace", b"a 1 4096 0\nf 1\n");
    let replay = Base {
        command: "replay",
        flags: &[("--backend", "sim"), ("--json", "")],
    };
    let mut cases = vec![
        case("no command", &[], 2, "Usage"),
        case("unknown command", &["bogus"], 2, "bogus"),
        case("unknown flag", &["devices", "--turbo"], 2, "--turbo"),
        case("replay without traces", &["replay"], 2, "TRACE"),
        case(
            "binary garbage as a flag value",
            &["devices", "--sim-memory", "\u{1}\u{7f}\u{fffd}"],
            2,
            "--sim-memory",
        ),
        case(
            "a spike in the alerts scenario",
            &["demo", "--scenario", "alerts", "--spike-at", "3s"],
            2,
            "the alerts scenario moves pressure itself",
        ),
    ];
    rows(&DEVICES, &[], DEVICES_ROWS, 2, &mut cases);
    rows(&DEMO, &[], DEMO_ROWS, 2, &mut cases);
    rows(&SERVE, &[], SERVE_ROWS, 2, &mut cases);
    rows(&replay, &[&trace], REPLAY_ROWS, 2, &mut cases);
    // An address this host does not have is a failure to bind (exit 1), not bad syntax.
    let unbindable: Rows = &[("--listen", "192.0.2.1:9400", "could not listen on")];
    rows(&DEMO, &[], unbindable, 1, &mut cases);
    let not_a_directory = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let collect_file: Rows = &[("--collect-dir", not_a_directory, "is not a directory")];
    rows(&SERVE, &[], collect_file, 2, &mut cases);
    // A negative number after a space is taken for a flag by the parser: still exit 2, and
    // the message quotes it.
    for (args, needle) in [
        (&["replay", "--device", "-1", &trace][..], "'-1'"),
        (&["devices", "--sim-devices", "-1"], "'-1'"),
        (&["demo", "--interval", "-1s"], "'-1"),
    ] {
        cases.push(case(&format!("{args:?}"), args, 2, needle));
    }
    // The human table (not --json) must not start before a bad value is found either.
    let table = [
        "replay",
        "--backend",
        "sim",
        "--idle-per-mille",
        "2000",
        &trace,
    ];
    cases.push(case("replay table", &table, 2, "--idle-per-mille"));
    if gpumem::backend::open_backend(gpumem::BackendChoice::Cuda, Default::default()).is_err() {
        let cuda = ["devices", "--backend", "cuda"];
        cases.push(case("no GPU", &cuda, 1, "CUDA driver unavailable"));
    }
    let huge = "9223372036854775807";
    let shape = [
        "--hidden",
        huge,
        "--intermediate",
        "1",
        "--layers",
        "1",
        "--vocab",
        "1",
        "--heads",
        "1",
        "--kv-heads",
        "1",
    ];
    for (args, needle) in [
        (&["--model", "gpt-9"][..], "gpt-9"),
        (&["--model", "llama-7b", "--batch", "0"], "--batch"),
        (&["--model", "llama-7b", "--batch=-2"], "--batch"),
        (&shape, "hidden"),
        (
            &["--model", "llama-7b", "--batch", "99999999999999999999"],
            "--batch",
        ),
        (&["--model", "llama-7b", "--dtype", "fp7"], "fp7"),
    ] {
        let mut full = vec!["estimate", "--backend", "sim"];
        full.extend(args);
        cases.push(case(&format!("{full:?}"), &full, 2, needle));
    }
    run_table(cases);
}

/// The low findings of "Holding under load and hostile input": values that used to be accepted
/// (and misbehave later) or refused with a confusing message, each now exit 2 with one line.
#[test]
fn values_that_used_to_slip_through_are_refused() {
    let files = Files::new();
    let huge_request = files.write("huge.trace", b"a 1 107374182400 0\nf 1\n");
    let collect_dir = files.path("").display().to_string();
    let demo_rows: Rows = &[
        (
            "--duration",
            "0s",
            "--duration: '0s' would stop the demo at once",
        ),
        ("--duration", "-3s", "is negative"),
        (
            "--runbook-url",
            "javascript:alert(1)",
            "--runbook-url: \"javascript",
        ),
        (
            "--runbook-url",
            "data:text/html,x",
            "not an http:// or https:// URL",
        ),
        ("--allowed-hosts", "a,,b", "--allowed-hosts: an empty name"),
        (
            "--max-connections",
            "2",
            "--max-connections: 2 is out of range",
        ),
        ("--log-format", "xml", "xml"),
    ];
    let serve_rows: Rows = &[("--collect-max-series", "0", "--collect-max-series: 0")];
    let mut cases = Vec::new();
    rows(&DEMO, &[], demo_rows, 2, &mut cases);
    rows(
        &SERVE,
        &["--collect-dir", &collect_dir],
        serve_rows,
        2,
        &mut cases,
    );
    let demo = DEMO.args();
    let with = |extra: &[&'static str]| {
        let mut args = demo.to_vec();
        args.extend_from_slice(extra);
        args
    };
    cases.extend([
        case(
            "demo --duration -3s",
            &[
                "demo",
                "--backend",
                "sim",
                "--listen",
                "127.0.0.1:0",
                "--duration",
                "-3s",
            ],
            2,
            "--duration: '-3s' is negative",
        ),
        case(
            "demo --allowed-hosts ''",
            &with(&["--allowed-hosts", ""]),
            2,
            "--allowed-hosts",
        ),
        case(
            "demo --publish-dir /proc/nope",
            &with(&["--publish-dir", "/proc/nope"]),
            2,
            "--publish-dir",
        ),
        case(
            "garbage GPUMEM_LOG",
            &["devices", "--backend", "sim"],
            2,
            "GPUMEM_LOG: \"verbose\"",
        )
        .env("GPUMEM_LOG", "verbose"),
        case(
            "bad GPUMEM_LOG level",
            &["devices", "--backend", "sim"],
            2,
            "GPUMEM_LOG",
        )
        .env("GPUMEM_LOG", "gpumem=loud"),
        case(
            "bench --sizes 100G",
            &["bench", "--backend", "sim", "--sizes", "100G"],
            2,
            "--sizes: 100.00 GiB can never fit",
        ),
        case(
            "replay of a request that can never fit",
            &["replay", "--backend", "sim", &huge_request],
            2,
            "can never fit on device 0",
        ),
        case(
            "healthcheck URL with a space",
            &["healthcheck", "--url", "http://127.0.0.1:9/a b"],
            2,
            "--url",
        ),
        case(
            "healthcheck URL with CRLF",
            &[
                "healthcheck",
                "--url",
                "http://127.0.0.1:9/a\r\nX-Injected: 1",
            ],
            2,
            "--url",
        ),
        case(
            "healthcheck --timeout 0s",
            &["healthcheck", "--timeout", "0s"],
            2,
            "--timeout",
        ),
        case("GPUMEM_INTERVAL=fast", &demo, 2, "GPUMEM_INTERVAL: 'fast'")
            .env("GPUMEM_INTERVAL", "fast"),
    ]);
    run_table(cases);
}

/// Issue 48's smaller findings: values accepted, or refused with a message that did not say
/// what was wrong, each now exit 2 with one line and nothing on stdout.
#[test]
fn issue_48_values_are_refused_with_one_line() {
    let files = Files::new();
    let collect_dir = files.path("").display().to_string();
    let a_file = files.write("not-a-directory", b"");
    let serve_rows: Rows = &[("--collect-max-bytes", "0", "--collect-max-bytes: 0")];
    let mut cases = Vec::new();
    rows(
        &SERVE,
        &["--collect-dir", &collect_dir],
        serve_rows,
        2,
        &mut cases,
    );
    let demo = DEMO.args();
    fn with<'a>(demo: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = demo.to_vec();
        args.extend_from_slice(extra);
        args
    }
    let inside_the_file = format!("{a_file}/records");
    cases.extend([
        case(
            "demo --oom-dir FILE",
            &with(&demo, &["--oom-dir", &a_file]),
            2,
            "is a file, not a directory",
        ),
        case(
            "demo --oom-dir FILE/records",
            &with(&demo, &["--oom-dir", &inside_the_file]),
            2,
            "is a file, not a directory",
        ),
        case(
            "demo --publish-dir FILE",
            &with(&demo, &["--publish-dir", &a_file]),
            2,
            "--publish-dir",
        ),
        // Within the simulated 80 GiB device but past its pools' cap (90 %): it used to print
        // the table's header, then fail with exit 1.
        case(
            "bench --sizes 79G",
            &["bench", "--backend", "sim", "--sizes", "79G"],
            2,
            "--sizes: 79.00 GiB is more than gpumem's pools",
        ),
        // A value clap refuses, from a variable: one line naming the variable.
        case(
            "GPUMEM_MAX_CONNECTIONS=abc",
            &demo,
            2,
            "GPUMEM_MAX_CONNECTIONS",
        )
        .env("GPUMEM_MAX_CONNECTIONS", "abc"),
    ]);
    run_table(cases);
}
