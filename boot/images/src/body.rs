//! A response body wrapper that counts bytes, holds an admission permit for
//! the whole stream and reports the download when the stream ends.
//!
//! The permit must live exactly as long as the bytes flow, not as long as the
//! handler: the handler returns as soon as the headers are ready, while a
//! 2 GB body streams for minutes. So the permit moves into the body, and it is
//! released when the body is polled to its end or dropped, which is what hyper
//! does when the client disconnects.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::OwnedSemaphorePermit;

use crate::download::{Download, Outcome};
use crate::metrics::Metrics;

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
    /// The response's Content-Length: reaching it counts as completion even
    /// if the connection drops the body without polling it to its end.
    pub(crate) expected: Option<u64>,
    pub(crate) started: Instant,
    pub(crate) hook: Option<DownloadHook>,
}

impl Stream {
    fn finish(mut self, outcome: Outcome) {
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

/// The wrapped body.
pub(crate) struct TrackedBody {
    inner: Body,
    /// Counts bytes when set (the outermost wrapper of every response).
    metrics: Option<Metrics>,
    stream: Option<Stream>,
}

impl TrackedBody {
    pub(crate) fn new(inner: Body, metrics: Option<Metrics>, stream: Option<Stream>) -> Self {
        Self {
            inner,
            metrics,
            stream,
        }
    }
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if let Some(metrics) = &this.metrics {
                        metrics.bytes_served.inc_by(n);
                    }
                    if let Some(stream) = &mut this.stream {
                        stream.download.bytes += n;
                    }
                }
            }
            Some(Err(err)) => {
                if let Some(stream) = this.stream.take() {
                    stream.finish(Outcome::Failed(format!("reading the file: {err}")));
                }
            }
            None => {
                if let Some(stream) = this.stream.take() {
                    stream.finish(Outcome::Completed);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            let outcome = if stream.expected == Some(stream.download.bytes) {
                Outcome::Completed
            } else {
                Outcome::Failed("connection closed".into())
            };
            stream.finish(outcome);
        }
    }
}
