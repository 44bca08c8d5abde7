//! Issue 48, case 7: a process that started `gpumem_publish` and exits normally removes its
//! published file (docs/publish-format.md), and a child it forked that exits normally leaves
//! the parent's file alone. Its out-of-memory flight records go beside the file, in `oom/`. `gpumem.torch.publish` goes through this call. The library is the
//! cdylib built once per run for this profile (`python::library`), loaded by python3 through ctypes on the
//! simulated device; without python3 the test skips (fails under CI=true).

use super::python::library;
use crate::sidecar::TempDir;
use crate::web::tool_available;
use std::process::Command;

/// Publishes every 100 ms, forks a child that exits normally, checks the file survived it,
/// then returns from the script (the interpreter exits with status 0).
const SCRIPT: &str = r#"
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.gpumem_publish.argtypes = [ctypes.c_char_p]
assert lib.gpumem_publish(sys.argv[2].encode()) == 0, "gpumem_publish failed"
def files():
    return [n for n in os.listdir(sys.argv[2]) if n.endswith(".json")]
deadline = time.time() + 10
while not files() and time.time() < deadline:
    time.sleep(0.05)
assert files(), "nothing published"
child = os.fork()
if child == 0:
    sys.exit(0)
_, status = os.waitpid(child, 0)
assert status == 0, status
time.sleep(0.3)
assert files(), "the forked child removed its parent's file"
print("published", files())
"#;

/// Runs `script` in python3 with the library and `dir` as its arguments, on the simulated
/// device, publishing every 100 ms; what it printed, after checking it exited 0. `None` where
/// there is no python3 (a failure on CI).
fn run_script(script: &str, dir: &TempDir) -> Option<String> {
    if !tool_available("python3") {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "python3 is needed on CI"
        );
        eprintln!("skipped: no python3");
        return None;
    }
    let output = Command::new("python3")
        .args(["-c", script])
        .arg(library())
        .arg(dir.path())
        .env("GPUMEM_BACKEND", "sim")
        .env("GPUMEM_INTERVAL", "100ms")
        .env_remove("GPUMEM_PUBLISH_DIR")
        .output()
        .expect("python3 runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    Some(said)
}

#[test]
fn a_normal_exit_removes_the_file_gpumem_publish_wrote() {
    let dir = TempDir::new("capi-publish-exit");
    let Some(said) = run_script(SCRIPT, &dir) else {
        return;
    };
    assert!(said.contains("published"), "{said}");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left behind at exit: {left:?}\n{said}");
}

/// Publishes, is refused an allocation past the pools' cap on the simulated device (72 of its
/// 80 GiB), and waits for the flight record of that refusal in `<dir>/oom`, where a sidecar
/// reads engines' records.
const OOM_SCRIPT: &str = r#"
import ctypes, glob, json, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.gpumem_publish.argtypes = [ctypes.c_char_p]
lib.gpumem_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.gpumem_alloc.restype = ctypes.c_void_p
assert lib.gpumem_publish(sys.argv[2].encode()) == 0, "gpumem_publish failed"
assert not lib.gpumem_alloc(76 << 30, 0, None), "76 GiB past a 72 GiB cap was granted"
deadline = time.time() + 20
records = []
while not records and time.time() < deadline:
    time.sleep(0.1)
    records = glob.glob(os.path.join(sys.argv[2], "oom", "*.json"))
assert records, "no flight record in oom/"
with open(records[0]) as f:
    record = json.load(f)
print("record", record["trigger"], record["request"]["requested_bytes"])
"#;

#[test]
fn a_publishers_out_of_memory_is_recorded_beside_its_file() {
    let dir = TempDir::new("capi-publish-oom");
    let Some(said) = run_script(OOM_SCRIPT, &dir) else {
        return;
    };
    assert!(
        said.contains(&format!("record oom {}", 76u64 << 30)),
        "{said}"
    );
}
