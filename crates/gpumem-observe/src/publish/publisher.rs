//! The publisher: a background thread that, every interval, snapshots the process's managers
//! and writes them to `<dir>/gpumem-<pid>.json` atomically. Publishing never takes the engine
//! down: a failed write is logged (once per distinct error) and retried on the next tick.

use crate::sampler::{sampling_setters, Sampler, SamplingOptions, MIN_INTERVAL};
use gpumem::safe_fs::{write_atomically, WriteOptions};
use gpumem::units::format_duration;
use gpumem_wire::process::current_identity;
use gpumem_wire::published::{file_name, Identity, PublishedFile};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
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
    sampling: SamplingOptions,
    dir: Option<PathBuf>,
    process_name: Option<String>,
}

impl PublisherBuilder {
    sampling_setters!();

    /// The directory (default `$GPUMEM_PUBLISH_DIR`, else `/run/gpumem`); created if missing.
    /// One publisher per process: they would all write the same file.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
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
        if self.sampling.managers.is_empty() {
            return Err(PublishError::NoManagers);
        }
        let capture = self
            .sampling
            .capture_settings()
            .map_err(PublishError::IntervalTooShort)?;
        let interval = capture.interval;
        let dir = self.dir.unwrap_or_else(default_dir);
        let mut identity = current_identity();
        if let Some(name) = self.process_name {
            identity.process = gpumem_wire::process::clean_process_name(&name);
        }
        let dir_error = |source| PublishError::Dir {
            dir: dir.clone(),
            source,
        };
        if let Some(problem) = super::not_a_directory(&dir) {
            return Err(dir_error(std::io::Error::other(problem)));
        }
        std::fs::create_dir_all(&dir).map_err(dir_error)?;
        let mut worker = Worker {
            sampler: match self.sampling.flight {
                Some(flight) => Sampler::new(self.sampling.managers, capture).with_flight(flight),
                None => Sampler::new(self.sampling.managers, capture),
            },
            file: file_name(identity.pid),
            dir: dir.clone(),
            identity,
            last_error: None,
            stopping: Arc::new(AtomicBool::new(false)),
        };
        let stopping = Arc::clone(&worker.stopping);
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
            stopping,
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
    /// Set before a stop: a write the thread has not begun yet is skipped, so a file removed
    /// at exit is not written again by a thread that was still sampling.
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PublisherHandle {
    /// The file this process publishes to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops publishing, removes the file (so a collector drops this process at once) and waits.
    pub fn shutdown(mut self) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the publisher thread panicked");
            }
        }
    }
}

impl PublisherHandle {
    /// [`shutdown`](Self::shutdown), waiting at most `limit` for the thread; past it the file
    /// is removed here. For exit handlers: the thread may be stuck behind a lock the exiting
    /// thread holds, and an exit must not hang on it.
    pub fn shutdown_within(mut self, limit: Duration) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.stop.send(());
        let started = std::time::Instant::now();
        if let Some(thread) = self.thread.take() {
            while !thread.is_finished() && started.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(2));
            }
            if thread.is_finished() {
                let _ = thread.join();
                return;
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for PublisherHandle {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
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
    stopping: Arc<AtomicBool>,
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
        if self.stopping.load(Ordering::Acquire) {
            // Stopped while sampling: the file is being removed, never to be written again.
            return Ok(());
        }
        write_atomically(&self.dir.join(&self.file), &bytes, &WriteOptions::default())
    }
}
