//! The Python package against the real C library on the simulated device. Its own tests
//! (`python/tests`, ctypes and a stand-in `torch`, no PyTorch needed) run twice: from the source
//! tree against the library cargo built here, and against the wheel installed into a fresh
//! virtual environment on a PATH with no cargo, run from outside the repository. The wheel is
//! the one `.ci/run` builds from the package's sdist unpacked in an empty directory
//! (`python/build-wheel`, named by TEST_GPUMEM_WHEEL), or locally one these tests build the same way.
//! Also: its manylinux tag (`auditwheel show`), publishing with the library deleted, and
//! `pip install ./python` from the repository as the README says.
//!
//! Without python3 (or, for the wheel, maturin and auditwheel; or TEST_GPUMEM_WHEEL on CI) they fail
//! under CI=true and skip otherwise.

use crate::web::tool_available;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const REPOSITORY: &str = env!("CARGO_MANIFEST_DIR");

/// Where the wheel puts the library, inside the installed `gpumem` package (maturin's module
/// `gpumem._lib`; `_native.py` looks there).
const SHIPPED_LIBRARY: &str = "gpumem/_lib/lib_lib.so";

fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `command` and returns its output; fails the test with `failed` and what it printed
/// when it cannot start or exits non-zero.
fn run_ok(command: &mut Command, failed: &str) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("{failed}: {e}"));
    assert!(output.status.success(), "{failed}:\n{}", text(&output));
    output
}

/// A new virtual environment at `root`.
fn create_venv(root: &Path) {
    run_ok(
        Command::new("python3").args(["-m", "venv"]).arg(root),
        "python3 -m venv failed (install python3-venv)",
    );
}

/// The target directory this test binary was built in: it is `<target>/<profile>/deps/it-*`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .nth(3)
        .expect("<target>/<profile>/deps/<test binary>")
        .to_path_buf()
}

/// The C library (crates/gpumem-cdylib) for this test binary's profile, built once per run as
/// a user builds it (`cargo build -p gpumem-cdylib`) into this target directory: `cargo test`
/// builds no cdylib, that crate having no tests.
pub(super) fn library() -> PathBuf {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            let profile = exe
                .ancestors()
                .nth(2)
                .expect("<target>/<profile>/deps/<test binary>");
            let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
            cargo
                .args(["build", "-p", "gpumem-cdylib"])
                .current_dir(REPOSITORY)
                .env("CARGO_TARGET_DIR", target_dir());
            if profile.file_name().is_some_and(|p| p == "release") {
                cargo.arg("--release");
            }
            run_ok(&mut cargo, "cargo build -p gpumem-cdylib failed");
            let name = format!(
                "{}gpumem{}",
                std::env::consts::DLL_PREFIX,
                std::env::consts::DLL_SUFFIX
            );
            let library = profile.join(&name);
            assert!(library.is_file(), "cargo built no {}", library.display());
            library
        })
        .clone()
}

/// The wheel under test, built once per run: the file TEST_GPUMEM_WHEEL names (`.ci/run` builds it
/// and must name it under CI=true), else one `python/build-wheel` builds into this target
/// directory. None, and the caller skips, where that cannot be done outside CI.
fn wheel() -> Option<&'static Path> {
    static WHEEL: OnceLock<Option<PathBuf>> = OnceLock::new();
    WHEEL
        .get_or_init(|| {
            if let Some(named) = std::env::var_os("TEST_GPUMEM_WHEEL").filter(|v| !v.is_empty()) {
                let path = PathBuf::from(named);
                assert!(
                    path.is_file(),
                    "TEST_GPUMEM_WHEEL names {}, which is not a file",
                    path.display()
                );
                // pip runs in other directories: a relative name must not depend on this one.
                return Some(path.canonicalize().unwrap_or(path));
            }
            assert!(
                !on_ci(),
                "CI=true but TEST_GPUMEM_WHEEL is not set: .ci/run builds the wheel (python/build-wheel) \
                 and names it there"
            );
            if !tool_available("python3") || !tool_available("maturin") {
                return None;
            }
            let built = run_ok(
                Command::new("bash")
                    .arg(Path::new(REPOSITORY).join("python/build-wheel"))
                    .arg(target_dir().join("python-wheel"))
                    .env("CARGO_TARGET_DIR", target_dir()),
                "python/build-wheel failed",
            );
            let stdout = String::from_utf8_lossy(&built.stdout);
            let path = PathBuf::from(stdout.lines().last().expect("the wheel's path").trim());
            assert!(path.is_file(), "build-wheel named {}", path.display());
            Some(path)
        })
        .as_deref()
}

/// A fresh virtual environment with the wheel installed, and the PATH to run it on: its own
/// `bin`, then /usr/bin and /bin unless one of them holds a cargo. No cargo is reachable there.
struct Venv {
    _dir: tempfile::TempDir,
    root: PathBuf,
    path: String,
}

impl Venv {
    fn with_wheel(wheel: &Path) -> Venv {
        let dir = tempfile::tempdir().expect("temporary directory");
        let root = dir.path().join("venv");
        create_venv(&root);
        let bin = root.join("bin");
        let has_cargo = |dir: &Path| dir.join("cargo").exists() || dir.join("rustc").exists();
        assert!(!has_cargo(&bin), "the new environment has a cargo");
        let mut dirs = vec![bin];
        dirs.extend(
            ["/usr/bin", "/bin"]
                .iter()
                .map(PathBuf::from)
                .filter(|dir| !has_cargo(dir)),
        );
        let path = std::env::join_paths(&dirs)
            .expect("a PATH")
            .into_string()
            .expect("a UTF-8 PATH");
        let venv = Venv {
            _dir: dir,
            root,
            path,
        };
        // Proved, not assumed: nothing named cargo resolves on this PATH.
        let cargo = venv
            .command("sh")
            .args(["-c", "command -v cargo rustc rustup"])
            .output()
            .expect("sh runs");
        assert!(
            !cargo.status.success() && cargo.stdout.is_empty(),
            "cargo is reachable on {}: {}",
            venv.path,
            text(&cargo)
        );
        run_ok(
            venv.python()
                .args(["-m", "pip", "install", "--quiet", "--no-index", "--no-deps"])
                .arg(wheel),
            &format!("pip install {} failed", wheel.display()),
        );
        venv
    }

    /// A command in an environment holding nothing of this one's (no CARGO, no PYTHONPATH, no
    /// GPUMEM_*) but the venv's PATH, run from the venv's directory, outside the repository.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env_clear()
            .env("PATH", &self.path)
            .env("HOME", self.root.parent().expect("the venv's parent"))
            .env("LANG", "C.UTF-8")
            .env("GPUMEM_BACKEND", "sim")
            .env("GPUMEM_SIM_MEMORY", "4GiB")
            .current_dir(self.root.parent().expect("the venv's parent"));
        command
    }

    fn python(&self) -> Command {
        self.command(self.root.join("bin/python").to_str().expect("UTF-8"))
    }

    /// `python -c CODE` with the stand-in torch importable, and what it printed.
    fn run(&self, code: &str, extra: &[(&str, &str)]) -> Output {
        let mut python = self.python();
        python
            .args(["-c", code])
            .env(
                "PYTHONPATH",
                Path::new(REPOSITORY).join("python/tests/fake_torch"),
            )
            .envs(extra.iter().copied());
        python.output().expect("python runs")
    }

    fn site_packages(&self) -> PathBuf {
        let asked = self
            .python()
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['platlib'])",
            ])
            .output()
            .expect("python runs");
        assert!(asked.status.success(), "{}", text(&asked));
        PathBuf::from(String::from_utf8_lossy(&asked.stdout).trim())
    }
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
        .env_remove("TEST_GPUMEM_INSTALLED")
        .output()
        .expect("python3 runs");
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}");
    assert!(report.contains("OK"), "{report}");
}

/// The wheel is tagged manylinux (`auditwheel show` agrees, and finds no library outside the
/// manylinux policy: libcuda and NVML are opened at run time) and holds the library, the
/// header, the typing marker and the `.pth` for the top of site-packages.
#[test]
fn the_wheel_is_manylinux_and_holds_the_library_and_the_gpumem_torch_switch() {
    let Some(wheel) = wheel() else { return };
    let name = wheel.file_name().expect("a file").to_string_lossy();
    assert!(
        name.starts_with("gpumem_allocator-")
            && name.contains("-py3-none-")
            && name.contains("manylinux"),
        "{name}: one wheel for every Python 3, tagged manylinux"
    );
    // PyTorch's own floor, so pip takes it where PyTorch's wheels install (RHEL 8, Ubuntu 20.04).
    let tag = name.split("-py3-none-").nth(1).expect("a platform tag");
    assert_at_most_glibc_2_28(tag, &name);
    if tool_available("auditwheel") {
        let shown = Command::new("auditwheel")
            .arg("show")
            .arg(wheel)
            .output()
            .expect("auditwheel runs");
        let report = text(&shown)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(shown.status.success(), "auditwheel show: {report}");
        assert!(
            report.contains("is consistent with the following platform tag: \"manylinux_"),
            "auditwheel show: {report}"
        );
        // auditwheel's own reading of the symbols the library needs, not only the name's.
        let consistent = report
            .split("platform tag: \"")
            .nth(1)
            .expect("a platform tag");
        assert_at_most_glibc_2_28(consistent, "auditwheel show");
        assert!(
            !report.contains("external shared libraries are required"),
            "the library needs a shared library outside the manylinux policy: {report}"
        );
    }
    let listed = Command::new("python3")
        .args(["-m", "zipfile", "-l"])
        .arg(wheel)
        .output()
        .expect("python3 runs");
    let listing = text(&listed);
    assert!(listed.status.success(), "{listing}");
    for expected in [
        SHIPPED_LIBRARY,
        "gpumem/gpumem.h",
        "gpumem/py.typed",
        "gpumem/torch.py",
        // The PyTorch layer's sources, compiled on first use against the installed PyTorch.
        "gpumem/_torch_layer.py",
        "gpumem/torch_layer/allocator.cpp",
        "gpumem/torch_layer/private_pools.h",
        ".data/purelib/gpumem-torch.pth",
    ] {
        assert!(
            listing.contains(expected),
            "{name} lacks {expected}:\n{listing}"
        );
    }
}

/// `tag` starts with manylinux_2_N (N at most 28), or with a legacy manylinux1/2010/2014 tag.
fn assert_at_most_glibc_2_28(tag: &str, what: &str) {
    let legacy = ["manylinux1_", "manylinux2010_", "manylinux2014_"];
    if legacy.iter().any(|l| tag.starts_with(l)) {
        return;
    }
    let minor: u32 = tag
        .strip_prefix("manylinux_2_")
        .and_then(|rest| rest.split('_').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {tag} is not a manylinux_2_N tag"));
    assert!(
        minor <= 28,
        "{what}: {tag} needs glibc 2.{minor}; manylinux_2_28 (PyTorch's floor) or older"
    );
}

/// The wheel installed where there is no cargo, and the package's tests run against that copy
/// (TEST_GPUMEM_INSTALLED=1 adds the ones that check what went where: the package and the
/// `.pth` in site-packages, the library inside the package).
#[test]
fn the_installed_wheel_passes_the_package_tests_with_no_cargo_on_the_path() {
    let Some(wheel) = wheel() else { return };
    let venv = Venv::with_wheel(wheel);
    let site = venv.site_packages();
    assert!(
        site.join("gpumem-torch.pth").is_file(),
        "no .pth in {}",
        site.display()
    );
    assert!(site.join(SHIPPED_LIBRARY).is_file());
    let output = venv
        .python()
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(Path::new(REPOSITORY).join("python/tests"))
        .env("TEST_GPUMEM_INSTALLED", "1")
        .output()
        .expect("python runs");
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}");
    assert!(report.contains("OK"), "{report}");
    for ran in [
        "test_the_package_is_the_installed_one",
        "test_gpumem_torch_variable_installs_it_when_torch_is_imported",
        "test_publishing_needs_no_library",
    ] {
        assert!(
            report.contains(&format!("{ran} (")) && !report.contains(&format!("{ran} ... skipped")),
            "{ran} did not run:\n{report}"
        );
    }
    // GPUMEM_TORCH=1 through the installed .pth alone: no PYTHONPATH to the package, no
    // GPUMEM_LIBRARY; the library PyTorch is handed is the one inside the installed package.
    let check = "import gpumem, os, torch.cuda.memory as m\n\
                 assert gpumem.library_path().startswith(os.path.dirname(gpumem.__file__))\n\
                 ptr = m.allocate(3 << 20)\n\
                 assert ptr, 'the installed library allocates'\n\
                 import gpumem.torch as gt\n\
                 assert gt.in_use() and gt.memory_allocated(0) >= 3 << 20\n\
                 assert m.current.path == gpumem.library_path(), m.current.path\n\
                 m.free(ptr, 3 << 20)\n\
                 print('ok', gt.memory_allocated(0))\n";
    let ran = venv.run(check, &[("GPUMEM_TORCH", "1")]);
    assert!(ran.status.success(), "{}", text(&ran));
    assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), "ok 0");
}

/// `gpumem.publish` is for processes that keep PyTorch's allocator: with the wheel's library
/// deleted, the package still imports and publishes, and asking for the library says what is
/// missing.
#[test]
fn publishing_from_the_installed_wheel_works_with_its_library_deleted() {
    let Some(wheel) = wheel() else { return };
    let venv = Venv::with_wheel(wheel);
    let shipped = venv.site_packages().join(SHIPPED_LIBRARY);
    std::fs::remove_file(&shipped).expect("the installed library");
    let out = venv
        .root
        .parent()
        .expect("the venv's parent")
        .join("published");
    std::fs::create_dir(&out).expect("a directory to publish into");
    let code = "import json, os, gpumem, gpumem.torch, gpumem.publish\n\
                path = gpumem.publish.publish_once()\n\
                document = json.load(open(path))\n\
                print('published', os.path.dirname(path), document['format'], document['writer'])\n\
                stop = gpumem.publish.start(interval=0.05)\n\
                stop()\n\
                print('removed', not os.path.exists(path))\n\
                try:\n    print('library found at', gpumem.library_path())\n\
                except gpumem.GpumemError as error:\n    print('missing:', error)\n";
    let out_text = out.to_str().expect("UTF-8");
    let ran = venv.run(code, &[("GPUMEM_PUBLISH_DIR", out_text)]);
    let said = text(&ran);
    assert!(ran.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "published {out_text} gpumem.publish torch 0.0+fake"
        )),
        "{said}"
    );
    assert!(said.contains("removed True"), "{said}");
    assert!(
        said.contains(&format!("missing: {} is missing", shipped.display())),
        "{said}"
    );
}

/// `pip install ./python` into a fresh virtual environment, as the README says for a checkout:
/// maturin (the PEP 517 backend, fetched by pip) builds the library with cargo (into a directory
/// of this test's target directory: maturin's build of the library differs from cargo's, and in
/// cargo's own directory it would replace the library other tests are loading), the package
/// carries it, and the installed `.pth` makes GPUMEM_TORCH=1 work with no code change.
#[test]
fn pip_installs_the_package_from_the_repository_with_cargo() {
    if !tool_available("python3") || !tool_available("cargo") {
        return;
    }
    let venv = tempfile::tempdir().expect("temporary directory");
    create_venv(venv.path());
    let python = venv.path().join("bin/python");
    run_ok(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "./python"])
            .current_dir(REPOSITORY)
            .env("CARGO_TARGET_DIR", target_dir().join("pip-install")),
        "pip install ./python failed",
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
    assert!(ran.status.success(), "{}", text(&ran));
    assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), "ok 0");
}
