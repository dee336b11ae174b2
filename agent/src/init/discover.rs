//! `/init` in discovery mode: a node the inventory does not know was booted
//! by `/ipxe/` with a one-time discovery nonce (`mprov_discover`, bound to
//! the MAC that booted and good only for reporting). Instead of enrolling
//! and booting an image, the agent:
//!
//! 1. brings up the interface that booted ([`super::boot::network_up`]: the
//!    lease iPXE carried, or DHCP), and every other link without an address,
//!    so that LLDP is heard on all of them;
//! 2. fetches the control service's CA and checks it against `mprov_ca`;
//! 3. listens for LLDP ([`crate::nads::listen`]: the window ends early once
//!    every link was heard from) and reads vendor, model and serial;
//! 4. posts the report with the nonce and says the control service's
//!    answer: matched (the MAC is bound: the next boot is a normal one) or
//!    parked (an admin assigns it);
//! 5. reboots: at once when matched, after [`PARKED_WAIT`] when parked, so a
//!    parked node asks again (with a new nonce) until an admin has assigned
//!    it. A failure reboots after [`FAILED_WAIT`]: the nonce may be spent,
//!    and only `/ipxe/` mints another.
//!
//! A discovery boot never enrolls and never receives an image or anything
//! of another node: the nonce is good for the report alone.

use std::path::Path;
use std::time::Duration;

use mprov_api::nads::{DEFAULT_WINDOW_SECONDS, ReportOutcome};
use nix::sys::reboot::{RebootMode, reboot};

use super::boot::{Fatal, fatal, network_up};
use super::netlink::{self, Netlink};
use super::{network, say};
use crate::cmdline::{BootParams, Nonce};
use crate::{enroll, nads};

/// How long a parked node waits before it reboots to report again.
pub const PARKED_WAIT: Duration = Duration::from_secs(300);
/// How long a node whose discovery failed waits before it reboots.
pub const FAILED_WAIT: Duration = Duration::from_secs(60);

/// Runs discovery and reboots; never returns.
pub fn run(params: &BootParams, nonce: Nonce) -> ! {
    let wait = match discover(params, nonce) {
        Ok(ReportOutcome::Matched { hostname }) => {
            say!(
                "discovery: matched to {hostname}: its MAC is bound; rebooting into a normal boot"
            );
            Duration::ZERO
        }
        Ok(ReportOutcome::Parked { reason }) => {
            say!(
                "discovery: parked for an admin to assign ({reason}); reporting again in {} s",
                PARKED_WAIT.as_secs()
            );
            PARKED_WAIT
        }
        Err(fatal) => {
            say!(
                "mprov-agent: discovery FAILED: {fatal}; rebooting in {} s for a new nonce",
                FAILED_WAIT.as_secs()
            );
            FAILED_WAIT
        }
    };
    std::thread::sleep(wait);
    nix::unistd::sync();
    let Err(err) = reboot(RebootMode::RB_AUTOBOOT);
    say!("mprov-agent: rebooting: {err}");
    super::power_off()
}

fn discover(params: &BootParams, nonce: Nonce) -> Result<ReportOutcome, Fatal> {
    let net = network_up(params)?;
    links_up(&net.interface);
    let pin = params
        .ca()
        .ok_or_else(|| fatal(2, "no valid mprov_ca= on the kernel command line"))?;
    let ca_pem =
        enroll::fetch_ca(&net.url, pin.as_bytes()).map_err(|err| fatal(2, super::chain(&err)))?;
    say!(
        "discovery: the CA certificate at {} matches mprov_ca",
        net.url
    );
    let links = nads::links_to_listen(&nads::interfaces());
    say!(
        "discovery: listening for LLDP on {} link(s) for at most {DEFAULT_WINDOW_SECONDS} s",
        links.len()
    );
    let heard = nads::listen(
        links,
        Duration::from_secs(DEFAULT_WINDOW_SECONDS),
        &|line: &str| say!("discovery: {line}"),
    )
    .map_err(|err| fatal(3, super::chain(&err)))?;
    let report = heard.report(&net.mac, nads::read_hardware(Path::new("/")));
    for line in nads::table(&report).lines() {
        say!("discovery: {line}");
    }
    nads::send(
        &net.url,
        &report,
        &nads::Credentials::Discovery { nonce, ca_pem },
    )
    .map_err(|err| fatal(4, super::chain(&err)))
}

/// Every link but loopback and `booted` up, without an address: LLDP is
/// heard on a link only while it is up. A link that will not come up is
/// said and left out.
fn links_up(booted: &str) {
    let interfaces = match network::interfaces() {
        Ok(found) => found,
        Err(err) => {
            say!("discovery: listing network interfaces: {err}");
            return;
        }
    };
    let mut nl = match Netlink::open() {
        Ok(nl) => nl,
        Err(err) => {
            say!("discovery: opening rtnetlink: {err}");
            return;
        }
    };
    for interface in interfaces.iter().filter(|i| i.name != booted) {
        let Ok(index) = nix::net::if_::if_nametoindex(interface.name.as_str()) else {
            continue;
        };
        let seq = nl.next_seq();
        if let Err(err) = nl.request(&netlink::link_up(index, None, seq), seq) {
            say!("discovery: bringing {} up: {err}", interface.name);
        }
    }
}
