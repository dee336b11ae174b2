//! What both listeners share: the cheap checks on raw bytes, parsing into a
//! hickory request, answering it from the catalog of the zones being served,
//! and encoding the response within the transport's size limit.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_server::net::NetError;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{
    Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::Record;
use hickory_server::proto::serialize::binary::{BinEncodable, BinEncoder};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::live::{LiveZones, ServedZones};
use crate::DnsConfig;
use crate::metrics::Metrics;

/// What every task shares.
pub(crate) struct Shared {
    pub(super) config: DnsConfig,
    /// The zones being served, swapped on every new snapshot.
    pub(super) live: LiveZones,
    pub(super) metrics: Metrics,
    pub(super) permits: Arc<Semaphore>,
}

impl Shared {
    /// Parses and answers one request. Returns without sending anything if
    /// it does not parse.
    pub(super) async fn handle<R: ResponseHandler>(
        &self,
        raw: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
        responder: R,
    ) {
        if let Some(parsed) = self.parse(raw, src, protocol) {
            self.answer(parsed, responder).await;
        }
    }

    /// Parses a request and picks the zones generation that answers it.
    /// `None` (counted) if it is malformed or a response.
    pub(super) fn parse(
        &self,
        raw: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
    ) -> Option<Parsed> {
        let request = match Request::from_bytes(raw, src, protocol) {
            Ok(request) => request,
            Err(error) => {
                debug!(%src, %error, "malformed DNS packet");
                self.metrics.drop("malformed");
                return None;
            }
        };
        // Checked again after parsing: the header bit test in the listener
        // is the cheap path, this is the authoritative one.
        if request.metadata.message_type == MessageType::Response {
            self.metrics.drop("response");
            return None;
        }
        self.metrics.queries.inc();
        let zones = self.live.get();
        let forwarded = request
            .request_info()
            .ok()
            .is_some_and(|info| zones.is_forwarded(info.query.name()));
        Some(Parsed {
            request,
            zones,
            forwarded,
        })
    }

    /// Answers a parsed request from its zones' catalog and counts the
    /// outcome.
    pub(super) async fn answer<R: ResponseHandler>(&self, parsed: Parsed, responder: R) {
        let info = parsed
            .zones
            .catalog
            .handle_request::<_, TokioTime>(&parsed.request, responder)
            .await;
        if parsed.forwarded {
            self.metrics.forwarded.inc();
        }
        self.metrics.response(info.response_code);
    }
}

/// A request ready to answer, with the zones it will be answered from.
pub(super) struct Parsed {
    request: Request,
    zones: Arc<ServedZones>,
    /// Whether it goes to the upstream resolvers (and so may wait on them).
    pub(super) forwarded: bool,
}

/// Whether a reply to `src` could go anywhere sensible. Port 0, unspecified,
/// broadcast and multicast sources are spoofed or reflected traffic.
pub(super) fn answerable(src: SocketAddr) -> bool {
    if src.port() == 0 {
        return false;
    }
    match src.ip() {
        IpAddr::V4(ip) => !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast()),
        IpAddr::V6(ip) => !(ip.is_unspecified() || ip.is_multicast()),
    }
}

/// Cheap checks on the raw bytes, before any work: long enough for a header
/// and not a response (QR bit, RFC 1035 §4.1.1).
pub(super) fn precheck(packet: &[u8]) -> Result<(), &'static str> {
    match packet.get(2) {
        None => Err("short"),
        Some(_) if packet.len() < 12 => Err("short"),
        Some(flags) if flags & 0x80 != 0 => Err("response"),
        Some(_) => Ok(()),
    }
}

/// A bare SERVFAIL answer to query `id`: what goes out when a response
/// cannot be encoded, as in hickory's own server.
fn servfail(id: u16) -> Result<(ResponseInfo, Vec<u8>), NetError> {
    let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
    metadata.response_code = ResponseCode::ServFail;
    let header = Header {
        metadata,
        counts: HeaderCounts::default(),
    };
    let mut bytes = Vec::with_capacity(12);
    header.emit(&mut BinEncoder::new(&mut bytes))?;
    Ok((ResponseInfo::from(header), bytes))
}

/// Where one transport puts an encoded response: the part of a
/// [`ResponseHandler`] that differs between UDP, TCP and the fixture.
#[async_trait::async_trait]
pub(super) trait Deliver: Clone + Send + Sync + Unpin + 'static {
    /// The transport, which sets the size limit of the encoding.
    fn protocol(&self) -> Protocol;

    /// Sends (or keeps) one encoded response, without any length prefix.
    async fn deliver(&mut self, bytes: Vec<u8>) -> Result<(), NetError>;
}

/// The catalog's [`ResponseHandler`]: encodes each response within its
/// transport's limit (RFC 1035 §4.2.1, RFC 6891 §6.2.5 for EDNS), a bare
/// SERVFAIL where that fails, then hands the bytes to `D`.
#[derive(Clone)]
pub(super) struct Responder<D>(pub(super) D);

#[async_trait::async_trait]
impl<D: Deliver> ResponseHandler for Responder<D> {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let id = response.metadata().id;
        let max_size = match (self.0.protocol(), response.edns()) {
            (Protocol::Udp, Some(edns)) => edns.max_payload().max(512),
            (Protocol::Udp, None) => 512,
            _ => u16::MAX,
        };
        let mut bytes = Vec::with_capacity(512);
        let emitted = {
            let mut encoder = BinEncoder::new(&mut bytes);
            encoder.set_max_size(max_size);
            response.destructive_emit(&mut encoder)
        };
        let (info, bytes) = match emitted {
            Ok(info) => (info, bytes),
            Err(error) => {
                warn!(%error, "cannot encode DNS response; sending SERVFAIL");
                servfail(id)?
            }
        };
        self.0.deliver(bytes).await?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_unanswerable_sources() {
        let check = |s: &str, ok: bool| assert_eq!(answerable(s.parse().unwrap()), ok, "{s}");
        check("127.0.0.1:5353", true);
        check("[::1]:5353", true);
        check("127.0.0.1:0", false);
        check("0.0.0.0:53", false);
        check("255.255.255.255:53", false);
        check("224.0.0.1:53", false);
        check("[::]:53", false);
        check("[ff02::1]:53", false);
    }

    #[test]
    fn prechecks_header() {
        assert_eq!(precheck(&[]), Err("short"));
        assert_eq!(precheck(&[0; 11]), Err("short"));
        assert_eq!(precheck(&[0; 12]), Ok(()));
        let mut response = [0u8; 12];
        response[2] = 0x80;
        assert_eq!(precheck(&response), Err("response"));
    }
}
