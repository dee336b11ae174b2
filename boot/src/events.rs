//! The job server's part of the boot timeline: the DHCP server tells a
//! channel of every reply it sent ([`mprov_dhcp::server::Sent`]), and one
//! task posts them to the control service's `POST /api/v1/boot/events` with
//! the job server's own client (its certificate over HTTPS, as renewed).
//!
//! A `dhcp_acked` with the leased address is what lets `/ipxe/` hand a node
//! its enrollment nonce, so reports go out at once, in order; the servers
//! never wait for them (a full channel drops the report, not the reply).

use std::time::Duration;

use mprov_api::boot::{BootEventReport, BootPhase};
use mprov_api::client::Client;
use mprov_dhcp::ReplyKind;
use mprov_dhcp::server::Sent;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Reports waiting to be sent at most; more are dropped (and logged).
pub const QUEUE: usize = 4096;
/// Tries per report while the control service does not answer.
const TRIES: u32 = 3;
/// The pause before the first retry; doubled for each further one.
const RETRY: Duration = Duration::from_millis(300);

/// The report of a DHCP reply, if it is one the timeline keeps (not NAKs).
pub fn from_dhcp(sent: &Sent) -> Option<BootEventReport> {
    let phase = match (sent.proxy, sent.kind) {
        (_, ReplyKind::Nak) => return None,
        (true, _) => BootPhase::ProxyAnswered,
        (false, ReplyKind::Offer) => BootPhase::DhcpOffered,
        (false, ReplyKind::Ack) => BootPhase::DhcpAcked,
    };
    Some(BootEventReport {
        phase,
        mac: Some(sent.mac.clone()),
        system: None,
        ip: sent.ip.map(std::net::IpAddr::V4),
        detail: String::new(),
    })
}

/// Posts every report from `rx` until `stop`. Only reports made with the
/// job server's own certificate attest nodes' `/ipxe/` requests; on the API
/// key they are stored but do not count.
pub async fn report(
    clients: watch::Receiver<Client>,
    mut rx: mpsc::Receiver<Sent>,
    stop: CancellationToken,
) {
    let mut warned = false;
    loop {
        let sent = tokio::select! {
            () = stop.cancelled() => return,
            s = rx.recv() => match s {
                Some(s) => s,
                None => return,
            },
        };
        let Some(event) = from_dhcp(&sent) else {
            continue;
        };
        // The current client: the job server renews its certificate.
        let client = clients.borrow().clone();
        let mut pause = RETRY;
        for attempt in 1..=TRIES {
            match client.report_boot_event(&event).await {
                Ok(_) => {
                    warned = false;
                    break;
                }
                // Refused (a MAC the inventory does not know is still stored;
                // a 4xx means this job server may not report): no retry.
                Err(e) if e.status().is_some_and(|s| s.is_client_error()) => {
                    if !warned {
                        tracing::warn!(error = %e, "the control service refused a boot event; nodes on this job server will not get enrollment nonces (check this job server's certificate)");
                        warned = true;
                    }
                    break;
                }
                Err(e) if attempt == TRIES => {
                    tracing::warn!(error = %e, mac = %sent.mac, phase = event.phase.as_str(), "cannot report a boot event; dropped");
                }
                Err(_) => {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause *= 2;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dhcp_replies_become_timeline_events() {
        let sent = |kind, proxy| Sent {
            kind,
            mac: "52:54:00:00:00:01".into(),
            ip: Some("10.0.0.50".parse().unwrap()),
            proxy,
        };
        let ack = from_dhcp(&sent(ReplyKind::Ack, false)).unwrap();
        assert_eq!(ack.phase, BootPhase::DhcpAcked);
        assert_eq!(ack.ip, Some("10.0.0.50".parse().unwrap()));
        assert_eq!(ack.mac.as_deref(), Some("52:54:00:00:00:01"));
        assert_eq!(
            from_dhcp(&sent(ReplyKind::Offer, false)).unwrap().phase,
            BootPhase::DhcpOffered
        );
        assert_eq!(
            from_dhcp(&sent(ReplyKind::Offer, true)).unwrap().phase,
            BootPhase::ProxyAnswered
        );
        assert_eq!(from_dhcp(&sent(ReplyKind::Nak, false)), None);
    }
}
