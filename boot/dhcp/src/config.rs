//! Process knobs of the DHCP server: what the inventory snapshot does not say.
//!
//! The snapshot (`mprov_api::boot::BootConfig`) says *who* gets *what*
//! (networks, pools, reservations, the iPXE script URL). This struct says how
//! this job server answers: its own address (server identifier, RFC 2132
//! §9.7, and next-server, RFC 2131 §2), the iPXE binaries it names for each
//! firmware (RFC 4578 §2.1), lease lengths, and the bounds on work in flight.

use std::net::Ipv4Addr;
use std::time::Duration;

/// Default lease for a pool (unknown) client: short, because an unknown node
/// is usually a discovery boot that comes back with a reservation.
pub const DEFAULT_POOL_LEASE: Duration = Duration::from_secs(5 * 60);
/// Default lease for a reserved address.
pub const DEFAULT_RESERVED_LEASE: Duration = Duration::from_secs(12 * 60 * 60);
/// How long an offered pool address is held for the client it was offered to.
pub const DEFAULT_OFFER_HOLD: Duration = Duration::from_secs(30);
/// How many packets may be in flight at once; more wait in the socket buffer.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;
/// How long one packet may take, lease commit included, before it is dropped.
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(3);
/// Boot file for legacy BIOS PXE (architecture 0).
pub const DEFAULT_BIOS_FILE: &str = "undionly.kpxe";
/// Boot file for x86-64 UEFI PXE (architectures 7 and 9).
pub const DEFAULT_X64_EFI_FILE: &str = "snponly.efi";
/// Boot file for arm64 UEFI PXE (architecture 11).
pub const DEFAULT_ARM64_EFI_FILE: &str = "snponly-arm64.efi";

/// How this server answers; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct DhcpConfig {
    /// Our address on the served network: the server identifier (option 54).
    /// Direct (not relayed) packets are served from the network containing it.
    pub server_ip: Ipv4Addr,
    /// Where PXE clients fetch the boot file by TFTP (siaddr); `server_ip` if unset.
    pub next_server: Option<Ipv4Addr>,
    /// proxyDHCP (PXE specification §2.2.5): hand out boot information only,
    /// never addresses, beside a site's own DHCP server.
    pub proxy: bool,
    /// Lease for pool clients.
    pub pool_lease: Duration,
    /// Lease for reserved addresses.
    pub reserved_lease: Duration,
    /// How long an OFFERed pool address is held for its client.
    pub offer_hold: Duration,
    /// BIOS PXE boot file.
    pub bios_file: String,
    /// x86-64 UEFI PXE boot file.
    pub x64_efi_file: String,
    /// arm64 UEFI PXE boot file.
    pub arm64_efi_file: String,
    /// The URL UEFI HTTP boot clients (architecture 16) get; none: no answer
    /// with a boot file for them.
    pub http_boot_url: Option<String>,
    /// Packets handled at once.
    pub max_in_flight: usize,
    /// Time limit for one packet.
    pub handler_timeout: Duration,
}

impl DhcpConfig {
    /// The defaults for a server at `server_ip`.
    pub fn new(server_ip: Ipv4Addr) -> Self {
        Self {
            server_ip,
            next_server: None,
            proxy: false,
            pool_lease: DEFAULT_POOL_LEASE,
            reserved_lease: DEFAULT_RESERVED_LEASE,
            offer_hold: DEFAULT_OFFER_HOLD,
            bios_file: DEFAULT_BIOS_FILE.to_owned(),
            x64_efi_file: DEFAULT_X64_EFI_FILE.to_owned(),
            arm64_efi_file: DEFAULT_ARM64_EFI_FILE.to_owned(),
            http_boot_url: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            handler_timeout: DEFAULT_HANDLER_TIMEOUT,
        }
    }

    /// The next-server address (siaddr) for boot files.
    pub fn next_server(&self) -> Ipv4Addr {
        self.next_server.unwrap_or(self.server_ip)
    }
}
