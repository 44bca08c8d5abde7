//! Large bodies rendered once per sample and shared by every request: `/metrics`, the status
//! page, `/api/v1/snapshot` and the full `/api/v1/history`.
//!
//! Rendering per request let a burst of scrapes render the same snapshot hundreds of times at
//! once, each copy alive until its response was written: memory grew with the number of
//! requests in flight. Here each body is rendered by the first request that finds the cache
//! behind the latest sample, while the others wait for that one render (no thread is held while
//! they wait), and all of them send the same reference-counted bytes. Its gzip form is made
//! once too, by the first request that asks for it. A response being written keeps the bytes of
//! its own sample alive, nothing more.

use crate::history::Sample;
use axum::body::Bytes;
use std::sync::{Arc, Weak};
use tokio::sync::{Mutex, OnceCell};

/// Bodies smaller than this are sent as they are: gzip would save little and cost a header.
pub(super) const MIN_GZIP_BYTES: usize = 1024;

/// One rendered body and, once asked for, its gzip form.
pub(crate) struct Body {
    pub(crate) plain: Bytes,
    gzip: OnceCell<Bytes>,
}

impl Body {
    /// The gzip form, compressed by the first caller off the async workers; `None` when the
    /// body is too small to be worth it or compression failed (send it plain).
    pub(super) async fn gzip(&self) -> Option<Bytes> {
        if self.plain.len() < MIN_GZIP_BYTES {
            return None;
        }
        let plain = self.plain.clone();
        self.gzip
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || super::compress::gzip_bytes(&plain))
                    .await
                    .ok()
                    .flatten()
                    .ok_or(())
            })
            .await
            .ok()
            .cloned()
    }
}

/// What a cached body was rendered from: the sample (compared by identity; a weak reference
/// keeps its address from being reused without keeping the snapshot alive) and whether it was
/// fresh, which `/metrics` and the page show.
struct Entry {
    sample: Weak<Sample>,
    fresh: bool,
    body: Arc<Body>,
}

/// One body's cache; see the module documentation.
#[derive(Default)]
pub(super) struct BodyCache {
    entry: Mutex<Option<Entry>>,
}

impl BodyCache {
    /// The body of `sample` (as `fresh`), rendered by `render` on a blocking thread unless it
    /// already was. Concurrent callers for the same sample wait for one render.
    pub(super) async fn get<F>(
        &self,
        sample: &Arc<Sample>,
        fresh: bool,
        render: F,
    ) -> Result<Arc<Body>, String>
    where
        F: FnOnce() -> Result<Vec<u8>, String> + Send + 'static,
    {
        let mut entry = self.entry.lock().await;
        if let Some(cached) = entry.as_ref() {
            if cached.fresh == fresh && std::ptr::eq(cached.sample.as_ptr(), Arc::as_ptr(sample)) {
                return Ok(Arc::clone(&cached.body));
            }
        }
        // The previous body goes now, not after the render: only requests still writing it
        // keep it alive.
        *entry = None;
        let rendered = tokio::task::spawn_blocking(render)
            .await
            .map_err(|error| format!("rendering failed: {error}"))??;
        let body = Arc::new(Body {
            plain: Bytes::from(rendered),
            gzip: OnceCell::new(),
        });
        *entry = Some(Entry {
            sample: Arc::downgrade(sample),
            fresh,
            body: Arc::clone(&body),
        });
        Ok(body)
    }
}

/// The caches of every body the server shares between requests.
#[derive(Default)]
pub(super) struct Bodies {
    pub metrics: BodyCache,
    pub page: BodyCache,
    pub snapshot: BodyCache,
    pub history: BodyCache,
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_wire::Snapshot;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    fn sample() -> Arc<Sample> {
        Arc::new(Sample {
            snapshot: Snapshot::default(),
            taken_at: Instant::now(),
        })
    }

    #[test]
    fn a_sample_is_rendered_once_however_many_ask_at_once() {
        let runtime = crate::web::runtime::build("cache-test").expect("runtime");
        let cache = Arc::new(BodyCache::default());
        let renders = Arc::new(AtomicUsize::new(0));
        let first = sample();
        let ask = |sample: Arc<Sample>, fresh: bool| {
            let (cache, renders) = (Arc::clone(&cache), Arc::clone(&renders));
            async move {
                cache
                    .get(&sample, fresh, move || {
                        renders.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok(vec![b'x'; 4096])
                    })
                    .await
            }
        };
        runtime.block_on(async {
            let asked: Vec<_> = (0..200)
                .map(|_| tokio::spawn(ask(Arc::clone(&first), true)))
                .collect();
            let mut bodies = Vec::new();
            for task in asked {
                bodies.push(task.await.expect("task").expect("body"));
            }
            assert_eq!(
                renders.load(Ordering::SeqCst),
                1,
                "one render for 200 requests"
            );
            assert!(
                bodies.iter().all(|b| Arc::ptr_eq(b, &bodies[0])),
                "one shared body"
            );
            let gzip = bodies[0].gzip().await.expect("compressible");
            assert!(gzip.len() < 4096);
            let again = bodies[1].gzip().await.expect("compressible");
            assert_eq!(gzip.as_ptr(), again.as_ptr(), "compressed once");
            // Staleness and a new sample each render again.
            ask(Arc::clone(&first), false).await.expect("body");
            ask(sample(), false).await.expect("body");
            assert_eq!(renders.load(Ordering::SeqCst), 3);
        });
    }
}
