//! The OOM flight recorder's flags, shared by `gpumem demo` and `gpumem serve`.

use super::CliError;
use clap::Args;
use gpumem::units::parse_bytes;
use gpumem_observe::flight::FlightSettings;
use std::path::{Path, PathBuf};

/// Where OOM and critical-pressure records go (docs/runbook.md, "The OOM flight recorder").
#[derive(Args, Debug, Clone)]
pub(super) struct FlightFlags {
    /// Directory for the OOM flight recorder: one JSON record per OOM and per rise to critical
    /// pressure (created if missing). Without it the latest records are kept in memory only
    /// (GET /api/v1/oom). The demo defaults to `<publish-dir>/oom` when publishing.
    #[arg(long, env = "GPUMEM_OOM_DIR", value_name = "DIR")]
    pub oom_dir: Option<PathBuf>,

    /// Records kept in --oom-dir, at most; the oldest are removed first.
    #[arg(long, env = "GPUMEM_OOM_KEEP", default_value_t = 50, value_name = "N")]
    pub oom_keep: usize,

    /// Total size of the records kept in --oom-dir, at most (e.g. 64MiB).
    #[arg(
        long,
        env = "GPUMEM_OOM_MAX_SIZE",
        default_value = "64MiB",
        value_name = "SIZE"
    )]
    pub oom_max_size: String,
}

impl FlightFlags {
    /// The recorder's settings; `default_dir` is used when `--oom-dir` is not given.
    pub(super) fn settings(
        &self,
        default_dir: Option<PathBuf>,
    ) -> Result<FlightSettings, CliError> {
        if self.oom_keep == 0 || self.oom_keep > 10_000 {
            return Err(CliError::usage(format!(
                "--oom-keep: {} is out of range (1 to 10000)",
                self.oom_keep
            )));
        }
        let max_bytes = parse_bytes(&self.oom_max_size)
            .map_err(|e| CliError::usage(format!("--oom-max-size: {e}")))?;
        if max_bytes < 64 << 10 {
            return Err(CliError::usage(format!(
                "--oom-max-size: '{}' is too small; a record takes tens of KiB (at least 64KiB)",
                self.oom_max_size
            )));
        }
        // Without --oom-dir the records go under the caller's directory (`--publish-dir`'s
        // oom/), and an error there names that flag: the user never typed --oom-dir.
        let flag = match (&self.oom_dir, &default_dir) {
            (None, Some(_)) => "--publish-dir",
            _ => "--oom-dir",
        };
        let dir = self.oom_dir.clone().or(default_dir);
        if let Some(dir) = &dir {
            check_writable(dir)
                .map_err(|e| CliError::usage(format!("{flag}: {}: {e}", dir.display())))?;
        }
        Ok(FlightSettings {
            dir,
            max_files: self.oom_keep,
            max_bytes,
            ..FlightSettings::default()
        })
    }
}

/// Creates the directory if missing, so a typo or a read-only mount fails at start, not at the
/// first OOM.
fn check_writable(dir: &Path) -> std::io::Result<()> {
    if let Some(problem) = gpumem_observe::publish::not_a_directory(dir) {
        return Err(std::io::Error::other(problem));
    }
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".gpumem-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(probe)
}
