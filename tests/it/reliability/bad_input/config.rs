//! Bad configuration: TOML files (malformed, unknown keys and tables, wrong types, out of
//! range, binary garbage, missing, a directory) through `--config` and `GPUMEM_CONFIG`, and
//! `GPUMEM_<KEY>` variables, for the commands that run a manager (replay, demo).

use super::{case, run_table, Files, DEMO};

#[test]
fn bad_config_files_and_variables_exit_2_naming_the_key() {
    let files = Files::new();
    let trace = files.write("ok.trace", b"a 1 4096 0\nf 1\n");
    let mut cases = Vec::new();
    let configs: &[(&str, &[u8], &str)] = &[
        ("malformed TOML", b"leak_age = = 3\n", "not valid TOML"),
        (
            "unterminated table",
            b"[pressure\nhigh = 0.9\n",
            "not valid TOML",
        ),
        ("unknown key", b"turbo = true\n", "unknown key"),
        ("unknown table", b"[turbo]\nboost = 1\n", "turbo.boost"),
        (
            "nested too deep",
            b"[pressure.deep]\nx = 1\n",
            "pressure.deep",
        ),
        ("array of tables", b"[[pools]]\nsize = 1\n", "pools"),
        (
            "string for a number",
            b"gpu_memory_fraction = \"most\"\n",
            "not a number",
        ),
        (
            "array for a size",
            b"min_free_bytes = [1, 2]\n",
            "min_free_bytes",
        ),
        (
            "table for a size",
            b"min_free_bytes = { a = 1 }\n",
            "min_free_bytes",
        ),
        (
            "date for a size",
            b"min_free_bytes = 2024-01-01\n",
            "2024-01-01 is not a byte size",
        ),
        (
            "word for a bool",
            b"track_allocations = \"maybe\"\n",
            "track_allocations",
        ),
        ("number for a bool", b"cpu_fallback = 2\n", "cpu_fallback"),
        (
            "bad size unit",
            b"max_pool_size = \"12 parsecs\"\n",
            "max_pool_size",
        ),
        ("negative count", b"shards = -1\n", "shards"),
        (
            "huge count",
            b"shards = 99999999999999999999\n",
            "not valid TOML",
        ),
        (
            "fraction too high",
            b"gpu_memory_fraction = 1.5\n",
            "gpu_memory_fraction",
        ),
        (
            "fraction zero",
            b"gpu_memory_fraction = 0\n",
            "gpu_memory_fraction",
        ),
        (
            "fraction NaN",
            b"gpu_memory_fraction = nan\n",
            "gpu_memory_fraction",
        ),
        (
            "fraction infinite",
            b"gpu_memory_fraction = inf\n",
            "gpu_memory_fraction",
        ),
        ("too many shards", b"shards = 65\n", "shards"),
        (
            "small pool too small",
            b"small_max_bytes = 511\n",
            "small_max_bytes",
        ),
        (
            "small pool too large",
            b"small_max_bytes = \"1TiB\"\n",
            "small_max_bytes",
        ),
        (
            "idle per mille",
            b"idle_per_mille = 2000\n",
            "idle_per_mille",
        ),
        ("zero pool size", b"max_pool_size = 0\n", "max_pool_size"),
        ("zero leak age", b"leak_age = \"0s\"\n", "leak_age"),
        ("leak age without unit", b"leak_age = 30\n", "leak_age"),
        (
            "leak age out of range",
            b"leak_age = \"999999999999999999h\"\n",
            "leak_age",
        ),
        (
            "cleanup too often",
            b"cleanup_interval = \"1ms\"\n",
            "cleanup_interval",
        ),
        (
            "pressure out of order",
            b"[pressure]\nmedium = 0.9\nhigh = 0.8\n",
            "pressure",
        ),
        (
            "pressure negative",
            b"[pressure]\nmedium = -1\n",
            "pressure",
        ),
        ("unknown preset", b"preset = \"turbo\"\n", "unknown preset"),
        ("device list of words", b"devices = \"all\"\n", "devices"),
        ("negative device", b"devices = [-1]\n", "devices"),
        (
            "binary garbage",
            b"\xff\xfe\x00\x01garbage\x9c",
            "valid UTF-8",
        ),
        ("NUL bytes", b"shards = 1\x00\x00\n", "not valid TOML"),
    ];
    for (name, contents, needle) in configs {
        let path = files.write(&format!("{}.toml", name.replace(' ', "-")), contents);
        cases.push(case(
            &format!("config: {name}"),
            &[
                "replay",
                "--backend",
                "sim",
                "--json",
                "--config",
                &path,
                &trace,
            ],
            2,
            needle,
        ));
        cases.push(
            case(
                &format!("GPUMEM_CONFIG: {name}"),
                &["replay", "--backend", "sim", "--json", &trace],
                2,
                needle,
            )
            .env("GPUMEM_CONFIG", &path),
        );
    }
    let missing = files.path("missing.toml").display().to_string();
    let directory = files.dir.path().display().to_string();
    let demo = DEMO.args();
    for (name, path, needle) in [
        ("missing config file", missing.as_str(), "missing.toml"),
        (
            "config is a directory",
            directory.as_str(),
            "cannot read the config file",
        ),
    ] {
        for command in [&["replay", "--backend", "sim", "--json", &trace][..], &demo] {
            let mut args = command.to_vec();
            args.extend(["--config", path]);
            cases.push(case(&format!("{} {name}", command[0]), &args, 2, needle));
        }
    }
    let variables: &[(&str, &str, &str)] = &[
        ("GPUMEM_SHARDS", "abc", "GPUMEM_SHARDS"),
        ("GPUMEM_SHARDS", "-1", "GPUMEM_SHARDS"),
        ("GPUMEM_SHARDS", "65", "shards"),
        ("GPUMEM_GPU_MEMORY_FRACTION", "0", "gpu_memory_fraction"),
        (
            "GPUMEM_GPU_MEMORY_FRACTION",
            "lots",
            "GPUMEM_GPU_MEMORY_FRACTION",
        ),
        ("GPUMEM_MIN_FREE_BYTES", "-1", "GPUMEM_MIN_FREE_BYTES"),
        ("GPUMEM_MAX_POOL_SIZE", "0", "max_pool_size"),
        ("GPUMEM_SMALL_MAX_BYTES", "1TiB", "small_max_bytes"),
        ("GPUMEM_PRESSURE_HIGH", "2", "pressure"),
        ("GPUMEM_CLEANUP_INTERVAL", "1ms", "cleanup_interval"),
        (
            "GPUMEM_RELEASE_IDLE_AFTER",
            "soon",
            "GPUMEM_RELEASE_IDLE_AFTER",
        ),
        ("GPUMEM_CPU_FALLBACK", "maybe", "GPUMEM_CPU_FALLBACK"),
        ("GPUMEM_PRESET", "turbo", "unknown preset"),
        ("CUDA_MEMORY_POOL_SIZE", "lots", "CUDA_MEMORY_POOL_SIZE"),
        ("CUDA_MEMORY_POOL_TRIM", "maybe", "CUDA_MEMORY_POOL_TRIM"),
    ];
    for (variable, value, needle) in variables {
        cases.push(
            case(
                &format!("replay {variable}={value}"),
                &["replay", "--backend", "sim", "--json", &trace],
                2,
                needle,
            )
            .env(variable, value),
        );
    }
    // The demo runs a manager too: its configuration is checked the same way.
    cases.push(case("demo GPUMEM_LEAK_AGE=0s", &demo, 2, "leak_age").env("GPUMEM_LEAK_AGE", "0s"));
    cases.push(
        case("demo GPUMEM_SHARDS=abc", &demo, 2, "GPUMEM_SHARDS").env("GPUMEM_SHARDS", "abc"),
    );
    run_table(cases);
}
