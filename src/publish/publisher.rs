//! The publisher: a background thread that, every interval, snapshots the process's managers
//! and writes them to `<dir>/gpumem-<pid>.json` atomically. Publishing never takes the engine
//! down: a failed write is logged (once per distinct error) and retried on the next tick.

use super::format::{file_name, Identity, PublishedFile};
use super::process::current_identity;
use crate::manager::MemoryManager;
use crate::safe_fs::{write_atomically, WriteOptions};
use crate::sampler::{Sampler, MIN_INTERVAL};
use crate::snapshot::CaptureSettings;
use crate::units::format_duration;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;

/// Where snapshots go unless told otherwise (`GPUMEM_PUBLISH_DIR` overrides it).
pub const DEFAULT_DIR: &str = "/run/gpumem";

#[derive(Debug, Error)]
pub enum PublishError {
    #[error("the publisher needs at least one memory manager (call .manager(m))")]
    NoManagers,
    #[error("the interval {} is too short; the shortest is {}", format_duration(*.0), format_duration(MIN_INTERVAL))]
    IntervalTooShort(Duration),
    #[error("cannot publish into {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not start the publisher thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Entry point: `Publisher::builder().manager(m).dir("/run/gpumem").spawn()?`.
pub struct Publisher;

impl Publisher {
    pub fn builder() -> PublisherBuilder {
        PublisherBuilder::default()
    }
}

/// Settings of a publisher.
#[derive(Default)]
pub struct PublisherBuilder {
    managers: Vec<MemoryManager>,
    dir: Option<PathBuf>,
    interval: Option<Duration>,
    leak_age: Option<Duration>,
    long_lived_tags: Option<Vec<String>>,
    process_name: Option<String>,
    top_tags: Option<usize>,
    flight: Option<crate::flight::FlightSettings>,
}

impl PublisherBuilder {
    /// A manager to publish; call once per manager. One publisher per process: they all write
    /// the same file.
    pub fn manager(mut self, manager: MemoryManager) -> Self {
        self.managers.push(manager);
        self
    }

    /// The directory (default `$GPUMEM_PUBLISH_DIR`, else `/run/gpumem`); created if missing.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// How often to publish (default 1 s, at least 100 ms).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Age after which a live allocation is a leak suspect (default: the manager's `leak_age`).
    pub fn leak_age(mut self, age: Duration) -> Self {
        self.leak_age = Some(age);
        self
    }

    /// Tags expected to live for the whole run, never leak suspects (default: `weights`).
    pub fn long_lived_tags<S: Into<String>>(mut self, tags: impl IntoIterator<Item = S>) -> Self {
        self.long_lived_tags = Some(tags.into_iter().map(Into::into).collect());
        self
    }

    /// How many tags per device are published by name (default 10); the rest as `other`.
    pub fn top_tags(mut self, count: usize) -> Self {
        self.top_tags = Some(count.max(1));
        self
    }

    /// Runs the OOM flight recorder on the publisher's samples (for an engine without an
    /// exporter; with one, let the exporter record, or every record is written twice).
    pub fn flight(mut self, settings: crate::flight::FlightSettings) -> Self {
        self.flight = Some(settings);
        self
    }

    /// The `process` label (default: the process name, as `ps` shows it).
    pub fn process_name(mut self, name: impl Into<String>) -> Self {
        self.process_name = Some(name.into());
        self
    }

    /// Creates the directory, publishes the first snapshot (so a wrong directory is an error
    /// here, not a log line later) and starts the thread.
    pub fn spawn(self) -> Result<PublisherHandle, PublishError> {
        let Some(first) = self.managers.first() else {
            return Err(PublishError::NoManagers);
        };
        let interval = self.interval.unwrap_or(Duration::from_secs(1));
        if interval < MIN_INTERVAL {
            return Err(PublishError::IntervalTooShort(interval));
        }
        let mut capture = CaptureSettings {
            interval,
            leak_age: self.leak_age.unwrap_or(first.config().leak_age),
            pressure: first.config().pressure,
            ..CaptureSettings::default()
        };
        if let Some(tags) = self.long_lived_tags {
            capture.long_lived_tags = tags;
        }
        if let Some(count) = self.top_tags {
            capture.tags_listed = count;
        }
        let dir = self.dir.unwrap_or_else(default_dir);
        let mut identity = current_identity();
        if let Some(name) = self.process_name {
            identity.process = super::process::clean_process_name(&name);
        }
        let dir_error = |source| PublishError::Dir {
            dir: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(dir_error)?;
        let mut worker = Worker {
            sampler: match self.flight {
                Some(flight) => Sampler::new(self.managers, capture).with_flight(flight),
                None => Sampler::new(self.managers, capture),
            },
            file: file_name(identity.pid),
            dir: dir.clone(),
            identity,
            last_error: None,
        };
        worker.publish().map_err(dir_error)?;
        let path = dir.join(&worker.file);
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("gpumem-publisher".to_string())
            .spawn(move || worker.run(interval, &stopped))
            .map_err(PublishError::Thread)?;
        tracing::info!("publishing snapshots to {}", path.display());
        Ok(PublisherHandle {
            path,
            stop,
            thread: Some(thread),
        })
    }
}

/// `$GPUMEM_PUBLISH_DIR`, else [`DEFAULT_DIR`].
pub fn default_dir() -> PathBuf {
    std::env::var_os("GPUMEM_PUBLISH_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// A running publisher. Dropping it stops the thread, which removes the file; call
/// [`shutdown`](Self::shutdown) to wait for that.
#[must_use = "dropping the handle stops publishing"]
pub struct PublisherHandle {
    path: PathBuf,
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl PublisherHandle {
    /// The file this process publishes to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops publishing, removes the file (so a collector drops this process at once) and waits.
    pub fn shutdown(mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the publisher thread panicked");
            }
        }
    }
}

impl Drop for PublisherHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(());
    }
}

/// The thread's state.
struct Worker {
    sampler: Sampler,
    dir: PathBuf,
    file: String,
    identity: Identity,
    last_error: Option<String>,
}

impl Worker {
    fn run(mut self, interval: Duration, stopped: &mpsc::Receiver<()>) {
        // Waiting on the channel doubles as the sleep, so a stop (or a dropped handle) is seen
        // at once.
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
            if let Err(error) = self.publish() {
                let message = error.to_string();
                if self.last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(
                        "could not publish to {}: {message}; retrying every {}",
                        self.dir.join(&self.file).display(),
                        format_duration(interval)
                    );
                    self.last_error = Some(message);
                }
            } else if self.last_error.take().is_some() {
                tracing::info!("publishing to {} again", self.dir.display());
            }
        }
        let path = self.dir.join(&self.file);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!("could not remove {}: {error}", path.display()),
        }
    }

    fn publish(&mut self) -> std::io::Result<()> {
        let sample = self.sampler.sample();
        let file = PublishedFile::from_snapshot(&sample.snapshot, &self.identity);
        let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
        write_atomically(&self.dir.join(&self.file), &bytes, &WriteOptions::default())
    }
}
