//! Bad trace files (truncated or fake gzip, unknown ops, missing or extra fields, bad sizes,
//! bad ids, empty, binary garbage, one enormous line), and a replay that runs out of memory
//! half-way: exit 2 naming the file and line (exit 1 for the failure while running), and no
//! plot written.

use super::{case, run_table, Files};
use crate::reliability::gzip;

#[test]
fn bad_trace_files_exit_2_naming_the_line_and_write_no_plot() {
    let files = Files::new();
    let good = b"# {\"name\": \"ok\"}\na 1 4096 0\na 2 3000000 1\nf 1\nf 2\n";
    let full_gzip = gzip(good);
    let mut garbage = Vec::new();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..4096 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        garbage.push((state >> 24) as u8);
    }
    // Valid UTF-8 with no newline: one enormous line of nonsense (and a shorter one, whose
    // token the error quotes only in part).
    let long_line = "x".repeat(1 << 20);
    let traces: &[(&str, &[u8], &str)] = &[
        ("empty", b"", "no allocation events"),
        (
            "only comments",
            b"# {\"name\": \"x\"}\n# nothing else\n\n",
            "no allocation events",
        ),
        (
            "truncated gzip",
            &full_gzip[..full_gzip.len() / 2],
            "error reading the file",
        ),
        (
            "gzip header only",
            &full_gzip[..10],
            "error reading the file",
        ),
        (
            "bad gzip header",
            b"\x1f\x8bnot really gzip at all",
            "invalid gzip header",
        ),
        ("gzip of garbage", &gzip(&garbage), "line 1: invalid UTF-8"),
        ("binary garbage", &garbage, "invalid UTF-8"),
        (
            "one huge line",
            long_line.as_bytes(),
            "line 1: line longer than 65536 bytes",
        ),
        (
            "one long token",
            &long_line.as_bytes()[..10_000],
            "line 1: not a trace event",
        ),
        ("unknown op", b"a 1 100 0\nx 2\n", "line 2: unknown op 'x'"),
        ("missing stream", b"a 1 100\n", "missing field <stream>"),
        ("missing size", b"a 1\n", "missing field <size>"),
        ("missing id", b"f\n", "missing field <id>"),
        ("extra field", b"a 1 100 0 7\n", "extra field '7'"),
        ("negative size", b"a 1 -100 0\n", "field <size> is negative"),
        ("negative id", b"a -1 100 0\n", "field <id> is negative"),
        (
            "non-numeric size",
            b"a 1 lots 0\n",
            "field <size> is not an unsigned",
        ),
        (
            "float size",
            b"a 1 1e9 0\n",
            "field <size> is not an unsigned",
        ),
        (
            "plus sign",
            b"a 1 +100 0\n",
            "field <size> is not an unsigned",
        ),
        (
            "overflowing size",
            b"a 1 99999999999999999999999 0\n",
            "not an unsigned",
        ),
        (
            "overflowing stream",
            b"a 1 10 99999999999999999999\n",
            "field <stream>",
        ),
        ("zero size", b"a 1 0 0\n", "size 0"),
        ("absurd size", b"a 1 1099511627777 0\n", "absurd size"),
        (
            "free of unknown id",
            b"a 1 10 0\nf 2\n",
            "line 2: free of unknown id 2",
        ),
        (
            "double free",
            b"a 1 10 0\nf 1\nf 1\n",
            "line 3: free of already freed id 1",
        ),
        (
            "duplicate id",
            b"a 1 10 0\na 1 10 0\n",
            "line 2: duplicate allocation id 1",
        ),
        (
            "reused id after free",
            b"a 1 10 0\nf 1\na 1 10 0\n",
            "duplicate allocation id 1",
        ),
        (
            "bad metadata",
            b"# {bad json\na 1 10 0\n",
            "metadata is not valid JSON",
        ),
        (
            "invalid UTF-8 on line 3",
            b"a 1 10 0\nf 1\na 2 \xff\xfe 0\n",
            "line 3: invalid UTF-8",
        ),
    ];
    let mut cases = Vec::new();
    for (name, contents, needle) in traces {
        let file = format!("{}.trace", name.replace(' ', "-"));
        let path = files.write(&file, contents);
        let plot = files.path(&format!("{}.svg", name.replace(' ', "-")));
        let plot_arg = plot.display().to_string();
        cases.push(
            case(
                &format!("trace: {name}"),
                &["replay", "--backend", "sim", "--plot", &plot_arg, &path],
                2,
                needle,
            )
            .output(plot),
        );
    }
    let good_path = files.write("good.trace", good);
    let bad_path = files.write("second-bad.trace", b"a 1 10 0\nq\n");
    let plot = files.path("several.svg");
    let plot_arg = plot.display().to_string();
    let several = case(
        "a bad second trace stops everything before the first is replayed",
        &[
            "replay",
            "--backend",
            "sim",
            "--plot",
            &plot_arg,
            &good_path,
            &bad_path,
        ],
        2,
        "second-bad.trace line 2: unknown op 'q'",
    );
    cases.push(several.output(files.path("several-good.svg")));
    let directory = files.dir.path().display().to_string();
    let missing = files.path("missing.trace").display().to_string();
    cases.push(case(
        "trace is a directory",
        &["replay", "--backend", "sim", &directory],
        2,
        "is a directory",
    ));
    cases.push(case(
        "missing trace",
        &["replay", "--backend", "sim", &missing],
        2,
        "cannot open trace",
    ));
    run_table(cases);
}

/// Running out of memory half-way: a failure while running (exit 1) naming the event, and no
/// plot. A request larger than the whole device is bad input, found before the replay starts
/// (exit 2; it used to print the table's header, then fail with exit 1).
#[test]
fn a_replay_out_of_memory_half_way_exits_1_and_writes_no_plot() {
    let files = Files::new();
    let mut text = String::from("# {\"name\": \"grows\"}\n");
    for id in 0..12 {
        text.push_str(&format!("a {id} 268435456 0\n"));
    }
    let grows = files.write("grows.trace.gz", &gzip(text.as_bytes()));
    let too_big = files.write("too-big.trace", b"a 1 8589934592 0\nf 1\n");
    let plot = files.path("grows.svg");
    let plot_arg = plot.display().to_string();
    let mut cases = Vec::new();
    for strategy in ["pooled", "direct"] {
        cases.push(
            case(
                &format!("out of memory half-way ({strategy})"),
                &[
                    "replay",
                    "--backend",
                    "sim",
                    "--sim-memory",
                    "2GiB",
                    "--strategy",
                    strategy,
                    "--json",
                    "--plot",
                    &plot_arg,
                    &grows,
                ],
                1,
                "(allocating 268435456 bytes) failed: out of memory on device 0",
            )
            .output(plot.clone()),
        );
    }
    cases.push(
        case(
            "larger than the device",
            &[
                "replay",
                "--backend",
                "sim",
                "--sim-memory",
                "4GiB",
                "--json",
                &too_big,
            ],
            2,
            "too-big.trace: an allocation of 8.00 GiB can never fit on device 0",
        )
        .output(plot),
    );
    run_table(cases);
}
