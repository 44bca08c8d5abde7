//! The Python package against the real C library on the simulated device: its own tests
//! (`python/tests`, ctypes and a stand-in `torch`, no PyTorch needed), and `pip install ./python`
//! from a clean copy of the repository, as the README says. Both need python3: they fail
//! without it under CI=true and skip otherwise.

use crate::web::tool_available;
use std::path::{Path, PathBuf};
use std::process::Command;

const REPOSITORY: &str = env!("CARGO_MANIFEST_DIR");

/// The cdylib cargo built with this test binary: `cargo test` leaves it beside the binary in
/// `target/<profile>/deps` (only `cargo build` copies it up to `target/<profile>`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let name = format!(
        "{}gpumem{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let library = [deps.join(&name), deps.parent().unwrap_or(deps).join(&name)]
        .into_iter()
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{name} was not built next to {}", exe.display()));
    library
}

#[test]
fn the_python_package_tests_pass_on_the_simulated_device() {
    if !tool_available("python3") {
        return;
    }
    let output = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(Path::new(REPOSITORY).join("python/tests"))
        .env("PYTHONPATH", Path::new(REPOSITORY).join("python"))
        .env("GPUMEM_LIBRARY", library())
        .env("GPUMEM_BACKEND", "sim")
        .env("GPUMEM_SIM_MEMORY", "4GiB")
        .env_remove("GPUMEM_TORCH")
        .output()
        .expect("python3 runs");
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}");
    assert!(report.contains("OK"), "{report}");
}

/// `pip install ./python` into a fresh virtual environment, as the README says: cargo builds the
/// library (into this test's target directory, so nothing is compiled twice), the package
/// carries it, and the installed `.pth` makes GPUMEM_TORCH=1 work with no code change.
#[test]
fn pip_installs_the_package_with_its_library_and_the_gpumem_torch_switch() {
    if !tool_available("python3") || !tool_available("cargo") {
        return;
    }
    let venv = tempfile::tempdir().expect("temporary directory");
    let created = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv.path())
        .output()
        .expect("python3 runs");
    assert!(
        created.status.success(),
        "python3 -m venv failed (install python3-venv): {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let python = venv.path().join("bin/python");
    // The test binary is <target>/<profile>/deps/it-*: the library may sit in deps or one
    // level up, so the target directory is taken from the binary (taking it from the library
    // once pointed cargo at the checkout itself, which filled it with build output).
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("<target>/<profile>/deps/<test binary>")
        .to_path_buf();
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "./python"])
        .current_dir(REPOSITORY)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("pip runs");
    assert!(
        installed.status.success(),
        "pip install ./python failed:\n{}{}",
        String::from_utf8_lossy(&installed.stdout),
        String::from_utf8_lossy(&installed.stderr)
    );
    let fake_torch = Path::new(REPOSITORY).join("python/tests/fake_torch");
    let check = "import gpumem, os, torch.cuda.memory as m\n\
                 assert gpumem.library_path().startswith(os.path.dirname(gpumem.__file__))\n\
                 ptr = m.allocate(3 << 20)\n\
                 assert ptr, 'the installed library allocates'\n\
                 import gpumem.torch as gt\n\
                 assert gt.in_use() and gt.memory_allocated(0) >= 3 << 20\n\
                 m.free(ptr, 3 << 20)\n\
                 print('ok', gt.memory_allocated(0))\n";
    let ran = Command::new(&python)
        .args(["-c", check])
        .current_dir(venv.path())
        .env("PYTHONPATH", fake_torch)
        .env("GPUMEM_TORCH", "1")
        .env("GPUMEM_BACKEND", "sim")
        .env_remove("GPUMEM_LIBRARY")
        .output()
        .expect("python runs");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), "ok 0");
}
