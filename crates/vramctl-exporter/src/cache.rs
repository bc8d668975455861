//! The last rendered exposition, shared between the sampler thread (one writer, once a
//! tick) and the HTTP thread (many readers). A reader clones an `Arc` under a read lock
//! held for nanoseconds; it never waits for a collection.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use bytes::Bytes;

/// One tick's exposition in both formats, without the per-scrape tail.
#[derive(Debug, Clone)]
pub struct Published {
    /// Prometheus text format 0.0.4.
    pub prometheus: Bytes,
    /// OpenMetrics 1.0.0, without `# EOF`.
    pub openmetrics: Bytes,
    /// When it was published (monotonic), for the sample age.
    pub at: Instant,
    /// Published before the sampler's first collection (NVML has not answered yet):
    /// `/healthz` says the exporter is starting.
    pub starting: bool,
}

/// The latest [`Published`], if any yet.
#[derive(Debug, Default)]
pub struct Cache {
    current: RwLock<Option<Arc<Published>>>,
}

impl Cache {
    /// An empty cache (scrapes answer 503 until the first publish; `serve` publishes a
    /// starting exposition before it listens).
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the cached exposition.
    pub fn publish(&self, published: Published) {
        // A panic elsewhere while holding the lock cannot leave an `Option<Arc>` half
        // written, so a poisoned lock is still good.
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(published));
    }

    /// The latest exposition.
    pub fn latest(&self) -> Option<Arc<Published>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
