//! Prometheus metrics of the HTTP file server, and the router that exposes a
//! registry.
//!
//! The metrics live in [`Metrics`] whether or not anyone scrapes them (they are
//! a few atomics); the caller registers them into its own registry with
//! [`Metrics::register`], so one `/metrics` listener can expose every boot
//! service. `/metrics` is deliberately not on the file server's listener: nodes
//! must not be able to scrape the job server, and a scrape must never queue
//! behind image streams.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mprov_process::metrics::Prefixed;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The OpenMetrics content type that `prometheus_client` encodes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Counters and gauges of one file server.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Response body bytes handed to connections.
    pub(crate) bytes_served: Counter,
    /// Responses by status class (`2xx`, `3xx`, ...).
    pub(crate) requests: Family<[(&'static str, &'static str); 1], Counter>,
    /// Admitted image streams currently open.
    pub(crate) active_streams: Gauge,
    /// Image streams refused with 503 by admission control.
    pub(crate) rejected_streams: Counter,
    /// Connections open (counted against the connection cap).
    pub(crate) open_connections: Gauge,
    /// Idle connections closed to make room at the connection cap.
    pub(crate) closed_connections: Counter,
    /// New connections closed at once: the cap was reached and none was idle.
    pub(crate) refused_connections: Counter,
}

impl Metrics {
    /// Registers the metrics under the `http_` prefix (`mprov_http_` in the job server's registry, which is prefixed `mprov`).
    pub fn register(&self, registry: &mut Registry) {
        let mut r = Prefixed::new(registry, "http");
        r.share(
            "served_bytes",
            "Response body bytes sent",
            &self.bytes_served,
        );
        r.share("requests", "HTTP responses by status class", &self.requests);
        r.share(
            "active_streams",
            "Admitted image streams currently open",
            &self.active_streams,
        );
        r.share(
            "rejected_streams",
            "Image streams refused with 503 by admission control",
            &self.rejected_streams,
        );
        r.share(
            "open_connections",
            "Connections open, counted against the connection cap",
            &self.open_connections,
        );
        r.share(
            "closed_idle_connections",
            "Idle connections closed to make room at the connection cap",
            &self.closed_connections,
        );
        r.share(
            "refused_connections",
            "New connections closed at once: the cap was reached and none was idle",
            &self.refused_connections,
        );
    }

    /// Admitted image streams currently open.
    pub fn active_streams(&self) -> i64 {
        self.active_streams.get()
    }

    /// Image streams refused so far.
    pub fn rejected_streams(&self) -> u64 {
        self.rejected_streams.get()
    }

    /// Body bytes sent so far.
    pub fn bytes_served(&self) -> u64 {
        self.bytes_served.get()
    }

    pub(crate) fn count_status(&self, status: u16) {
        let class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.requests.get_or_create(&[("class", class)]).inc();
    }
}

/// `GET /metrics` in the OpenMetrics text format, for a listener of its own.
pub fn metrics_router(registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry)
}

async fn metrics(State(registry): State<Arc<Registry>>) -> Response {
    let mut text = String::new();
    match encode(&mut text, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(err) => {
            tracing::warn!("encoding metrics: {err}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
