//! The gpumem binary as the tests run it: a clean environment ([`gpumem`]), and a serving command
//! (`demo`, `serve`) started until it prints its URL and killed when dropped ([`Running`]).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The gpumem binary as a user runs it: none of the caller's `GPUMEM_*` (or CUDA pool)
/// settings, so a test sees exactly the input it names, and logging at its default level.
pub(crate) fn gpumem_as_user() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    for (key, _) in std::env::vars() {
        if key.starts_with("GPUMEM_") || key.starts_with("CUDA_MEMORY_POOL") {
            command.env_remove(key);
        }
    }
    command
}

/// [`gpumem_as_user`] with `args`, logging warnings only (for tests that read its output).
pub(crate) fn gpumem(args: &[&str]) -> Command {
    let mut command = gpumem_as_user();
    command.args(args).env("GPUMEM_LOG", "warn");
    command
}

/// What a finished command printed on stdout, as text.
pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a finished command printed on stderr, as text.
pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A serving gpumem command (`demo`, `serve`); killed if the test ends first.
pub(crate) struct Running {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Running {
    /// Starts `gpumem <args>` and waits (up to 30 s) for its first line, which must be
    /// "gpumem <command>: open http://ADDR/".
    pub(crate) fn start(args: &[&str]) -> Running {
        Self::start_with_stderr(args, Stdio::inherit())
    }

    /// [`start`](Self::start), its log (stderr) going to `stderr` (a file the test reads).
    pub(crate) fn start_with_stderr(args: &[&str], stderr: impl Into<Stdio>) -> Running {
        let mut command = gpumem(args);
        command.stderr(stderr);
        Self::start_command(command, args[0])
    }

    /// Starts `command` (a gpumem serving command, perhaps behind a shell that sets limits first)
    /// and waits, as [`start`](Self::start) does, for "gpumem <name>: open http://ADDR/".
    pub(crate) fn start_command(mut command: Command, name: &str) -> Running {
        let args = [name];
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .expect("the gpumem binary starts");
        let prefix = format!("gpumem {}: open http://", args[0]);
        let addr = url_on_first_line(&mut child, &prefix, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("gpumem {args:?} printed no URL"));
        Running { child, addr }
    }

    /// `gpumem demo` on the simulated device, on a free loopback port, sampling every 200 ms,
    /// exiting after `duration` ("60s").
    pub(crate) fn sim_demo(duration: &str) -> Running {
        Running::start(&[
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "200ms",
            "--backend",
            "sim",
            "--duration",
            duration,
        ])
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it with SIGKILL (no chance to clean up) and reaps it, so its pid is gone.
    pub(crate) fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for it to exit by itself.
    pub(crate) fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits (up to `limit`) for the exit.
    pub(crate) fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
        self.wait(limit)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_hard();
        }
    }
}

/// The address a child's first stdout line names after `prefix` (its "open http://ADDR/"),
/// waiting at most `within`; `None` when it prints nothing by then. Later lines are read and
/// dropped, so the child never blocks on a full pipe.
pub(crate) fn url_on_first_line(
    child: &mut Child,
    prefix: &str,
    within: Duration,
) -> Option<SocketAddr> {
    let stdout = child.stdout.take().expect("stdout piped");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let line = received.recv_timeout(within).ok()?;
    let url = line
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected first line: {line}"));
    Some(
        url.trim_end_matches('/')
            .parse()
            .expect("a socket address in the URL"),
    )
}
