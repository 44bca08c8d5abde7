//! The image of docker/Dockerfile, built for real and run: docker/build-image builds its target
//! `prebuilt` with buildah around this test run's gpumem binary, on a Debian base that
//! mmdebstrap makes from Debian's packages (no registry is needed). Inside the image, the
//! image's own entrypoint and command serve the simulated device, the image's own HEALTHCHECK
//! command passes against it (and fails once it is gone), and SIGTERM ends it cleanly. Skips
//! without buildah and mmdebstrap, unless CI=true.

use super::{repo, strings};
use crate::support::{target_dir, url_on_first_line};
use crate::web::{get, tool_available};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tag the test builds (replaced by each run, removed at the end).
const TAG: &str = "localhost/gpumem:it";

/// buildah on the test's own store under target/ (vfs: no overlay mounts needed).
struct Buildah {
    root: PathBuf,
}

impl Buildah {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("buildah");
        command
            .arg("--storage-driver")
            .arg("vfs")
            .arg("--root")
            .arg(self.root.join("storage"))
            .arg("--runroot")
            .arg(self.root.join("run"))
            .args(args)
            .stdin(Stdio::null());
        command
    }

    fn output(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("buildah runs")
    }

    /// stdout of a command that must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.output(args);
        assert!(
            output.status.success(),
            "buildah {args:?} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// A working container of the image, removed when dropped.
struct Container<'a> {
    buildah: &'a Buildah,
    name: String,
}

impl Container<'_> {
    /// `buildah run` in it: chroot isolation, the host's network, the image's user and
    /// environment with `env` added.
    fn run(&self, env: &[(&str, &str)], argv: &[String]) -> Command {
        let mut args = vec!["run".to_string(), "--isolation".into(), "chroot".into()];
        for (key, value) in env {
            args.push("--env".into());
            args.push(format!("{key}={value}"));
        }
        args.push(self.name.clone());
        args.push("--".into());
        args.extend(argv.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.buildah.command(&args)
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self.buildah.output(&["rm", &self.name]);
    }
}

/// `buildah run` of a server, killed if the test ends first.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn the_image_builds_and_serves_the_simulated_device_as_a_user_would_run_it() {
    if !tool_available("buildah") || !tool_available("mmdebstrap") {
        return;
    }
    let buildah = Buildah {
        root: target_dir().join("image"),
    };
    let started = Instant::now();
    let built = Command::new(repo("docker/build-image"))
        .args(["--binary", env!("CARGO_BIN_EXE_gpumem"), "--debian-base"])
        .arg("--root")
        .arg(&buildah.root)
        .arg(TAG)
        .stdin(Stdio::null())
        .output()
        .expect("docker/build-image runs");
    assert!(
        built.status.success(),
        "docker/build-image failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    eprintln!("image built in {:.0?}", started.elapsed());

    // What a runtime reads from the image: a non-root user, the entrypoint, the health check.
    let inspected: Value =
        serde_json::from_str(&buildah.ok(&["inspect", "--type", "image", TAG])).expect("JSON");
    let config = &inspected["Docker"]["config"];
    assert_eq!(config["User"], "10001:10001");
    let mut serve = strings(&config["Entrypoint"]);
    assert_eq!(serve, ["/usr/local/bin/gpumem"]);
    serve.extend(strings(&config["Cmd"]));
    assert_eq!(serve[1], "serve", "{serve:?}");
    let check = strings(&config["Healthcheck"]["Test"]);
    assert_eq!(check[0], "CMD", "{check:?}");
    let check = check[1..].to_vec();

    let container = Container {
        name: buildah.ok(&["from", TAG]).trim().to_string(),
        buildah: &buildah,
    };
    let id = container
        .run(&[], &["id".into(), "-u".into()])
        .output()
        .expect("buildah run");
    assert_eq!(String::from_utf8_lossy(&id.stdout).trim(), "10001");

    // The image's command as it is, on the simulated device and a free loopback port.
    let mut server = Server(
        container
            .run(
                &[("GPUMEM_BACKEND", "sim"), ("GPUMEM_LISTEN", "127.0.0.1:0")],
                &serve,
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("buildah run starts"),
    );
    let addr = first_url(&mut server.0, "gpumem serve: open http://");
    let metrics = get(addr, "/metrics");
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains("gpumem_up"), "{}", metrics.body);

    // The image's HEALTHCHECK command, where GPUMEM_LISTEN says the server is.
    let listen = addr.to_string();
    let health = container
        .run(&[("GPUMEM_LISTEN", &listen)], &check)
        .output()
        .expect("buildah run");
    assert!(
        health.status.success(),
        "the image's health check failed: {}{}",
        String::from_utf8_lossy(&health.stdout),
        String::from_utf8_lossy(&health.stderr)
    );
    assert!(String::from_utf8_lossy(&health.stdout).contains(" 200 "));

    // SIGTERM (what a container runtime sends the container's process when the kubelet stops
    // it) ends the server with status 0, and buildah with it. (buildah itself would pass on a
    // SIGKILL, so the signal goes to gpumem, a process of this host under chroot isolation.)
    let gpumem = descendant_named(server.0.id(), "gpumem").expect("gpumem runs under buildah");
    let sent = Command::new("kill")
        .args(["-TERM", &gpumem.to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "serve exited with {status} on SIGTERM");

    // And the same check fails once nothing answers: it reads the server, not a constant.
    let gone = container
        .run(&[("GPUMEM_LISTEN", &listen)], &check)
        .output()
        .expect("buildah run");
    assert!(
        !gone.status.success(),
        "the health check passed with no server"
    );

    drop(container);
    let _ = buildah.output(&["rmi", TAG]);
}

/// The address of the first stdout line, which must start with `prefix`.
fn first_url(child: &mut Child, prefix: &str) -> SocketAddr {
    url_on_first_line(child, prefix, Duration::from_secs(60))
        .expect("serve printed its URL inside the image")
}

/// The first process under `ancestor` (its children, theirs, ...) whose command is `name`.
fn descendant_named(ancestor: u32, name: &str) -> Option<u32> {
    // (pid, parent, command) of every process, from /proc/<pid>/stat.
    let processes: Vec<(u32, u32, String)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (command) state ppid ...": the command may hold spaces and parentheses.
            let (head, tail) = stat.rsplit_once(')')?;
            let command = head.split_once('(')?.1.to_string();
            let parent = tail.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, parent, command))
        })
        .collect();
    let mut frontier = vec![ancestor];
    while let Some(parent) = frontier.pop() {
        for (pid, _, command) in processes.iter().filter(|(_, p, _)| *p == parent) {
            if command == name {
                return Some(*pid);
            }
            frontier.push(*pid);
        }
    }
    None
}
