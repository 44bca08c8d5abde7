//! The exporter and the publisher a host may start through the C ABI (`gpumem_serve`,
//! `gpumem_publish`). They bring gpumem-observe (a web server, NVML) into the library, so they
//! sit behind the `exporter` feature (on by default, and in libgpumem.so): a Rust engine that
//! links this crate without it gets a C library of the allocator alone, whose two calls then
//! say so.

pub(super) use imp::*;

#[cfg(feature = "exporter")]
mod imp {
    use crate::runtime::runtime;
    use gpumem_observe::exporter::{parse_listen, Exporter, ExporterHandle, DEFAULT_LISTEN};
    use gpumem_observe::flight::FlightSettings;
    use gpumem_observe::publish::{default_dir, Publisher, PublisherHandle};
    use parking_lot::Mutex;
    use std::path::PathBuf;

    /// What a host started: at most one exporter and one publisher per process.
    #[derive(Default)]
    pub(crate) struct Handles {
        pub exporter: Mutex<Option<ExporterHandle>>,
        pub publisher: Mutex<Option<PublisherHandle>>,
    }

    pub(crate) fn serve(listen: Option<&str>) -> Result<i32, String> {
        let addr = parse_listen(listen.unwrap_or(DEFAULT_LISTEN))?;
        let runtime = runtime()?;
        let mut exporter = runtime.exporting.exporter.lock();
        if let Some(running) = exporter.as_ref() {
            return Ok(i32::from(running.local_addr().port()));
        }
        let handle = Exporter::builder()
            .manager(runtime.manager.clone())
            .listen(addr)
            .spawn()
            .map_err(|e| e.to_string())?;
        let port = i32::from(handle.local_addr().port());
        *exporter = Some(handle);
        Ok(port)
    }

    pub(crate) fn publish(dir: Option<&str>) -> Result<(), String> {
        let runtime = runtime()?;
        let mut publisher = runtime.exporting.publisher.lock();
        if publisher.is_some() {
            return Err("already publishing; one publisher per process".to_string());
        }
        let dir = dir.map_or_else(default_dir, PathBuf::from);
        // The process's out-of-memory flight records go beside its published file, where a
        // sidecar or node agent reads them (`<collect dir>/oom`), as `gpumem demo
        // --publish-dir` writes them.
        let flight = FlightSettings {
            dir: Some(dir.join("oom")),
            ..FlightSettings::default()
        };
        let builder = Publisher::builder()
            .manager(runtime.manager.clone())
            .dir(dir)
            .flight(flight);
        *publisher = Some(builder.spawn().map_err(|e| e.to_string())?);
        remove_published_file_at_exit();
        Ok(())
    }

    /// The process that started publishing: a forked child runs its parent's exit handlers too,
    /// and must leave the parent's file alone.
    static PUBLISHING_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// A normal exit (the end of `main`, `exit()`, Python's interpreter exit) removes the
    /// published file, as docs/publish-format.md promises: the runtime is a static, never dropped,
    /// so its publisher used to leave the file behind for the collector to age out.
    fn remove_published_file_at_exit() {
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        PUBLISHING_PID.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
        REGISTERED.call_once(|| {
            // SAFETY: `atexit` only records the address of a function taking no arguments and
            // returning nothing, which `stop_publishing_at_exit` is; it lives as long as the
            // library, which is not unloaded while the process runs its exit handlers.
            let _ = unsafe { libc::atexit(stop_publishing_at_exit) };
        });
    }

    extern "C" fn stop_publishing_at_exit() {
        if std::process::id() != PUBLISHING_PID.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // Never unwind out of an exit handler; never wait on a lock another thread may hold.
        let _ = std::panic::catch_unwind(|| {
            let Ok(runtime) = runtime() else { return };
            let Some(mut publisher) = runtime.exporting.publisher.try_lock() else {
                return;
            };
            if let Some(handle) = publisher.take() {
                handle.shutdown_within(std::time::Duration::from_secs(1));
            }
        });
    }
}

#[cfg(not(feature = "exporter"))]
mod imp {
    /// Nothing to hold: this build has no exporter.
    #[derive(Default)]
    pub(crate) struct Handles;

    const ABSENT: &str = "this build of the gpumem library has no exporter or publisher (the \
                          gpumem-capi crate's `exporter` feature was off)";

    pub(crate) fn serve(_listen: Option<&str>) -> Result<i32, String> {
        Err(ABSENT.to_string())
    }

    pub(crate) fn publish(_dir: Option<&str>) -> Result<(), String> {
        Err(ABSENT.to_string())
    }
}
