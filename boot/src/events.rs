//! The job server's part of the boot timeline: the DHCP server tells a
//! channel of every reply it sent ([`mprov_dhcp::server::Sent`], made a
//! report by [`from_dhcp`]), the TFTP server of every boot file it sent
//! whole ([`from_tftp`]), the file server of every finished download
//! of an image's kernel or agent initramfs ([`from_download`]), and one task
//! posts them to the control service's `POST /api/v1/boot/events/batch`,
//! as many at once as are queued ([`report`]), with the job server's own
//! client (its certificate over HTTPS, as renewed).
//!
//! Beside them, [`heartbeat`] reports the machine's load (every
//! [`HEARTBEAT_EVERY`] by default) to `POST /api/v1/boot/heartbeat`.
//!
//! A `dhcp_acked` with the leased address is what lets `/ipxe/` hand a node
//! its enrollment nonce, so reports go out at once, in order; the servers
//! never wait for them (a full channel drops the report, not the reply),
//! except that a full queue drops an offer's report but keeps a lease
//! report, waiting for room ([`forward_dhcp`]): without it a boot storm of
//! 1,000 nodes left 212 of them with no lease report, retrying `/ipxe/`
//! for nothing (`tests/bench/RESULTS.md`, storm).

use std::time::Duration;

use mprov_api::boot::{BootEventReport, BootPhase, ImageFile, MAX_BATCH};
use mprov_api::client::Client;
use mprov_dhcp::ReplyKind;
use mprov_dhcp::server::Sent;
use mprov_fileserver::{Download, Outcome};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Reports waiting to be sent at most; more are dropped (and logged).
pub const QUEUE: usize = 4096;
/// How long one batch of reports is retried while the control service
/// does not answer, answers 5xx or 429 (a restart, an upgrade, a storm):
/// the ones behind it wait in the queue meanwhile, so a restart loses none.
const GIVE_UP_AFTER: Duration = Duration::from_secs(120);
/// The pause before the first retry; doubled for each further one, up to
/// [`MAX_PAUSE`].
const RETRY: Duration = Duration::from_millis(300);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(5);

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

/// The report of a finished `/images/` download, if it is one the timeline
/// keeps: an image's kernel or its agent initramfs, sent whole. The node is
/// named by the address that fetched it (the control service finds the
/// lease) and, when the boot config knows it, by its host name.
pub fn from_download(download: &Download) -> Option<BootEventReport> {
    if download.outcome != Outcome::Completed {
        return None;
    }
    let file = download.path.rsplit('/').next()?;
    let phase = if file == ImageFile::Kernel.file_name() {
        BootPhase::KernelFetched
    } else if file == ImageFile::Initramfs.file_name() {
        BootPhase::InitramfsFetched
    } else {
        return None;
    };
    let ip = download.client.map(unmapped);
    Some(BootEventReport {
        phase,
        mac: None,
        system: download.node.clone(),
        ip,
        detail: download
            .log_line()
            .trim_start_matches("provisioning: ")
            .to_owned(),
    })
}

/// The report of a boot file (an iPXE binary) the TFTP server sent whole.
/// The node is named by the address that fetched it: the control service
/// finds the lease.
pub fn from_tftp(sent: &mprov_tftp::Sent) -> BootEventReport {
    BootEventReport {
        phase: BootPhase::BootFileSent,
        mac: None,
        system: None,
        ip: Some(unmapped(sent.peer.ip())),
        detail: format!("{} over TFTP ({} bytes)", sent.file, sent.bytes),
    }
}

/// An IPv4 client as IPv4 (a dual-stack socket sees it IPv4-mapped), as
/// the DHCP leases it was given name it.
fn unmapped(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    }
}

/// Turns the DHCP server's replies into reports on `tx` until `rx` closes.
///
/// When the queue is full (a boot storm: every node's DISCOVERs, OFFERs
/// and retransmissions at once), an offer's report is dropped, but a lease
/// report (`dhcp_acked`, `proxy_answered`) waits for room: it is what
/// `/ipxe/` waits for before it hands the node its nonce, so a dropped one
/// leaves the node retrying for nothing. The DHCP server itself never
/// waits: its channel to here absorbs the wait.
pub async fn forward_dhcp(mut rx: mpsc::Receiver<Sent>, tx: mpsc::Sender<BootEventReport>) {
    while let Some(sent) = rx.recv().await {
        let Some(event) = from_dhcp(&sent) else {
            continue;
        };
        match tx.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(event)) if attests(&event) => {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(mac = %sent.mac, "the boot event queue is full; a DHCP offer's report is dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

/// Reports again the leases a job server that started on its lease log
/// bound within `/ipxe/`'s attestation window
/// ([`mprov_dhcp::Server::recent_acks`]): a report queued but not posted
/// when it stopped died with it. Each waits for room, as a lease report
/// does.
pub async fn report_again(acks: Vec<Sent>, tx: &mpsc::Sender<BootEventReport>) {
    if !acks.is_empty() {
        tracing::info!(
            leases = acks.len(),
            "DHCP: reporting again the leases bound in the last {} s, which /ipxe/ attests nodes with",
            mprov_api::boot::ATTEST_WINDOW.as_secs()
        );
    }
    for sent in acks {
        let Some(mut event) = from_dhcp(&sent) else {
            continue;
        };
        event.detail = "reported again: the job server started on its lease log".to_owned();
        if tx.send(event).await.is_err() {
            return;
        }
    }
}

/// Whether `event` is a lease report `/ipxe/` attests a node with.
fn attests(event: &BootEventReport) -> bool {
    matches!(event.phase, BootPhase::DhcpAcked | BootPhase::ProxyAnswered)
}

/// Posts every report from `rx` until `stop`, as many at once as are
/// queued (up to [`MAX_BATCH`]: one request and one database transaction
/// for a whole batch, so the queue drains as fast as a storm fills it).
/// Only reports made with the job server's own certificate attest nodes'
/// `/ipxe/` requests; on the API key they are stored but do not count.
pub async fn report(
    clients: watch::Receiver<Client>,
    mut rx: mpsc::Receiver<BootEventReport>,
    stop: CancellationToken,
) {
    let mut warned = false;
    let mut waiting = false;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        batch.clear();
        tokio::select! {
            () = stop.cancelled() => return,
            n = rx.recv_many(&mut batch, MAX_BATCH) => if n == 0 {
                return;
            },
        }
        // The current client: the job server renews its certificate.
        let client = clients.borrow().clone();
        let mut pause = RETRY;
        let started = tokio::time::Instant::now();
        loop {
            match client.report_boot_events(&batch).await {
                Ok(outcome) => {
                    if waiting {
                        tracing::info!("the control service takes boot events again");
                        waiting = false;
                    }
                    match outcome.refused.first() {
                        None => warned = false,
                        Some(first) if !warned => {
                            let event = batch.get(first.index);
                            tracing::warn!(
                                refused = outcome.refused.len(),
                                of = batch.len(),
                                mac = event.and_then(|e| e.mac.as_deref()).unwrap_or_default(),
                                phase = event.map(|e| e.phase.as_str()).unwrap_or_default(),
                                "the control service refused boot events ({}: {}); the others were stored (further refusals are not logged until a batch passes whole)",
                                first.status,
                                first.message
                            );
                            warned = true;
                        }
                        Some(_) => {}
                    }
                    break;
                }
                // Refused whole (a 4xx means this job server may not
                // report): no retry.
                Err(e)
                    if e.status()
                        .is_some_and(|s| s.is_client_error() && s.as_u16() != 429) =>
                {
                    if !warned {
                        tracing::warn!(error = %e, "the control service refused boot events; nodes on this job server will not get enrollment nonces (check this job server's certificate)");
                        warned = true;
                    }
                    break;
                }
                Err(e) if started.elapsed() >= GIVE_UP_AFTER => {
                    tracing::warn!(error = %e, events = batch.len(), "cannot report boot events for {} s; dropped", GIVE_UP_AFTER.as_secs());
                    break;
                }
                Err(e) => {
                    if !waiting {
                        tracing::warn!(error = %e, "the control service does not take boot events; they wait here and are retried (each batch for up to {} s)", GIVE_UP_AFTER.as_secs());
                        waiting = true;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            }
        }
    }
}

/// How often a job server reports its load, unless told otherwise.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(15);

/// The one-minute load average in `/proc/loadavg`'s text.
pub fn load_avg(loadavg: &str) -> Option<f64> {
    loadavg
        .split_whitespace()
        .next()?
        .parse()
        .ok()
        .filter(|l: &f64| l.is_finite() && *l >= 0.0)
}

/// Reports this machine's load and the image streams being served to the
/// control service at once, then `every` and whenever the addresses
/// change (a registration), until `stop`: one heartbeat per
/// address `addresses` holds at the time (the control service sends a node
/// only to an address whose heartbeat is fresh), or one without an address
/// when it holds none (before registering, or registered without any).
/// `/ipxe/` lists the least loaded job server first. A failure is logged
/// once per address until a heartbeat from it gets through.
pub async fn heartbeat(
    mut clients: watch::Receiver<Client>,
    mut addresses: watch::Receiver<Vec<std::net::IpAddr>>,
    mut senders: crate::daemon::addresses::Senders,
    streams: crate::daemon::Streams,
    every: Duration,
    stop: CancellationToken,
) {
    let mut failing: std::collections::HashSet<Option<std::net::IpAddr>> = Default::default();
    let mut no_load = false;
    let mut every = tokio::time::interval(every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = true;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => {}
            // Registered (new addresses): a heartbeat on each at once, so
            // `/ipxe/` sends nodes to them now, not a whole period later
            // (a storm powered on just after a job server registered
            // waited 15 s for it).
            changed = addresses.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                every.reset();
            }
        }
        let load = match tokio::fs::read_to_string("/proc/loadavg").await {
            Ok(text) => load_avg(&text),
            Err(_) => None,
        };
        let Some(load_avg) = load else {
            if !no_load {
                tracing::warn!("cannot read the load average in /proc/loadavg; no heartbeat sent");
                no_load = true;
            }
            continue;
        };
        no_load = false;
        if clients.has_changed().unwrap_or(false) {
            senders.reset();
        }
        let client = clients.borrow_and_update().clone();
        let targets: Vec<Option<std::net::IpAddr>> = match addresses.borrow_and_update().as_slice()
        {
            [] => vec![None],
            some => some.iter().copied().map(Some).collect(),
        };
        for address in &targets {
            let beat = mprov_api::boot::Heartbeat {
                load_avg,
                address: *address,
                streams: streams.now(),
            };
            let shown = address.map_or_else(String::new, |a| format!(" on {a}"));
            // Each address's from that address, to its own URL if it has
            // one (`crate::daemon::addresses`).
            let sender = match address {
                Some(a) => senders.client(&client, *a),
                None => Ok(client.clone()),
            };
            let sent = match sender {
                Ok(sender) => sender.heartbeat(&beat).await.map_err(anyhow::Error::from),
                Err(e) => Err(e),
            };
            match sent {
                Ok(()) => {
                    if failing.remove(address) {
                        tracing::info!("heartbeats{shown} get through again");
                    }
                }
                Err(e) if failing.insert(*address) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot send this job server's heartbeat{shown}; nodes may not be sent to it, or sent to it while it is busy");
                }
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_average_is_the_first_field_of_proc_loadavg() {
        assert_eq!(load_avg("0.52 0.58 0.59 2/456 12345\n"), Some(0.52));
        assert_eq!(load_avg("12 1 1 1/1 1"), Some(12.0));
        for bad in ["", "\n", "x 0.1 0.1", "-1 0 0", "NaN 0 0", "inf 0 0"] {
            assert_eq!(load_avg(bad), None, "{bad:?}");
        }
    }

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

    #[tokio::test]
    async fn a_full_queue_drops_offers_but_waits_to_keep_every_lease_report() {
        let sent = |kind, last: u8| Sent {
            kind,
            mac: format!("52:54:00:00:00:{last:02x}"),
            ip: Some(std::net::Ipv4Addr::new(10, 0, 0, last)),
            proxy: false,
        };
        let (sent_tx, sent_rx) = mpsc::channel(16);
        let (tx, mut rx) = mpsc::channel(1);
        // The queue is full before the storm's replies arrive.
        tx.try_send(from_dhcp(&sent(ReplyKind::Offer, 1)).unwrap())
            .unwrap();
        for (kind, last) in [
            (ReplyKind::Offer, 2),
            (ReplyKind::Ack, 3),
            (ReplyKind::Offer, 4),
            (ReplyKind::Ack, 5),
        ] {
            sent_tx.send(sent(kind, last)).await.unwrap();
        }
        drop(sent_tx);
        let forward = tokio::spawn(forward_dhcp(sent_rx, tx));
        // On this one-thread runtime the forwarder runs until it waits for
        // room (the first ack) before anything is taken off the queue.
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        let mut got = Vec::new();
        while let Some(event) = rx.recv().await {
            got.push((event.phase, event.mac.unwrap_or_default()));
        }
        forward.await.unwrap();
        // The offer queued first, then both acks (each waited for room);
        // the offers that found the queue full are gone.
        assert_eq!(
            got,
            [
                (BootPhase::DhcpOffered, "52:54:00:00:00:01".to_owned()),
                (BootPhase::DhcpAcked, "52:54:00:00:00:03".to_owned()),
                (BootPhase::DhcpAcked, "52:54:00:00:00:05".to_owned()),
            ]
        );
    }

    #[test]
    fn boot_files_sent_over_tftp_become_timeline_events() {
        let sent = mprov_tftp::Sent {
            peer: "[::ffff:10.0.0.50]:1234".parse().unwrap(),
            file: "snponly.efi".into(),
            bytes: 2048,
        };
        let event = from_tftp(&sent);
        assert_eq!(event.phase, BootPhase::BootFileSent);
        assert_eq!(event.ip, Some("10.0.0.50".parse().unwrap()));
        assert_eq!((event.mac, event.system), (None, None));
        assert_eq!(event.detail, "snponly.efi over TFTP (2048 bytes)");
    }

    #[test]
    fn kernel_and_initramfs_downloads_become_timeline_events() {
        let download = |path: &str, outcome| Download {
            client: Some("10.0.0.50".parse().unwrap()),
            node: Some("c01".into()),
            path: path.into(),
            bytes: 1000,
            elapsed: Duration::from_millis(20),
            outcome,
        };
        let kernel = from_download(&download("/images/gpu/3/vmlinuz", Outcome::Completed)).unwrap();
        assert_eq!(kernel.phase, BootPhase::KernelFetched);
        assert_eq!(kernel.system.as_deref(), Some("c01"));
        assert_eq!(kernel.ip, Some("10.0.0.50".parse().unwrap()));
        assert!(
            kernel.detail.starts_with("c01 (10.0.0.50) got kernel"),
            "{}",
            kernel.detail
        );
        assert_eq!(
            from_download(&download("/images/gpu/3/initramfs.img", Outcome::Completed))
                .unwrap()
                .phase,
            BootPhase::InitramfsFetched
        );
        // Not a boot file, or not sent whole: not on the timeline.
        assert_eq!(
            from_download(&download(
                "/images/gpu/3/rootfs.tar.zst",
                Outcome::Completed
            )),
            None
        );
        assert_eq!(
            from_download(&download(
                "/images/gpu/3/vmlinuz",
                Outcome::Failed("client went away".into())
            )),
            None
        );
    }
}
