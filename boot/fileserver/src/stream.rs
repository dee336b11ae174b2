//! The bookkeeping of one `/images/` download: the admission permit it holds
//! while its bytes flow, and the report when it ends.
//!
//! [`Stream::finish`] consumes the stream, so every download is reported
//! exactly once, and the permit goes back before the report is written.

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::OwnedSemaphorePermit;

use crate::download::{Download, Outcome};

/// Called with every finished `/images/` download.
pub(crate) type DownloadHook = Arc<dyn Fn(&Download) + Send + Sync>;

/// An admission permit that keeps the active-streams gauge in step.
#[derive(Debug)]
pub(crate) struct Permit {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl Permit {
    pub(crate) fn new(permit: OwnedSemaphorePermit, gauge: Gauge) -> Self {
        gauge.inc();
        Self {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The bookkeeping of one `/images/` download.
pub(crate) struct Stream {
    /// Held until the stream ends; `None` for files below the threshold.
    pub(crate) permit: Option<Permit>,
    /// The record reported at the end; `bytes`, `elapsed` and `outcome` are
    /// filled in then.
    pub(crate) download: Download,
    pub(crate) started: Instant,
    pub(crate) hook: Option<DownloadHook>,
}

impl Stream {
    pub(crate) fn finish(mut self, outcome: Outcome) {
        drop(self.permit.take());
        self.download.elapsed = self.started.elapsed();
        self.download.outcome = outcome;
        let line = self.download.log_line();
        match self.download.outcome {
            Outcome::Completed => tracing::info!("{line}"),
            Outcome::Failed(_) => tracing::warn!("{line}"),
        }
        if let Some(hook) = &self.hook {
            hook(&self.download);
        }
    }
}
