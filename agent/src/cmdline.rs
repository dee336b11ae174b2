//! The kernel command line (`/proc/cmdline`) and the `mprov_*` parameters the
//! agent takes from it.
//!
//! The control service's iPXE script boots the kernel with (ARCHITECTURE.md,
//! "A node's boot", step 4):
//!
//! - `mprov_enroll=<nonce>`: the one-time enrollment nonce for this system, a
//!   secret until it is used: printed only as a short prefix ([`Nonce`]).
//! - `mprov_ca=<64 hex digits>`: the SHA-256 of the control service's CA
//!   certificate, which the agent will check the certificate it fetches against.
//! - `mprov_url=<http(s)://host[:port][/path]>`: the control service.
//! - `mprov_lease=<address>,<netmask>,<gateway>,<dns>,<server>,<mtu>,<domain>`:
//!   the lease iPXE holds (`mprov_ipxe::LEASE_ARG`, expanded by iPXE), which
//!   the agent configures its interface from instead of asking DHCP again
//!   ([`CarriedLease`]).
//!
//! Splitting follows the kernel's own `next_arg` (`lib/cmdline.c`), so that the
//! agent sees the parameters the kernel saw: words are separated by
//! whitespace; double quotes group words (`a="b c"`), and one pair of quotes
//! around the value (`a="b"`) or the whole word (`"a=b"`) is removed; the name
//! ends at the first `=`; `-` and `_` are the same in names. As for the
//! kernel's own parameters, the last occurrence of a name counts. Unknown names
//! and words without `=` are ignored.
//!
//! The line is untrusted bytes (it need not be UTF-8), so nothing here panics
//! and every problem is a small [`ParamError`] kept beside the parameter it is
//! about: the agent reports them all at once instead of stopping at the first.

use std::fmt;
use std::net::Ipv4Addr;
use std::ops::Range;

use thiserror::Error;

/// The longest nonce accepted. The control service mints far shorter ones;
/// this only bounds what a hostile line can make us carry.
pub const MAX_NONCE_LEN: usize = 256;
/// The longest control URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// One word of the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word<'a> {
    /// The name: the word (quotes removed) up to its first `=`.
    pub name: &'a [u8],
    /// The value after the first `=`, quotes removed; `None` without `=`.
    pub value: Option<&'a [u8]>,
    /// The word as written, quotes included.
    pub raw: &'a [u8],
}

/// Splits a command line into words the way the kernel does.
pub fn words(line: &[u8]) -> impl Iterator<Item = Word<'_>> {
    spans(line).map(move |span| word(&line[span]))
}

/// The byte ranges of the words of `line`: a word ends at whitespace outside
/// double quotes (an unclosed quote runs to the end of the line).
fn spans(line: &[u8]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < line.len() && is_space(line[at]) {
            at += 1;
        }
        if at == line.len() {
            return None;
        }
        let start = at;
        let mut in_quote = false;
        while at < line.len() && (in_quote || !is_space(line[at])) {
            if line[at] == b'"' {
                in_quote = !in_quote;
            }
            at += 1;
        }
        Some(start..at)
    })
}

/// The kernel's `isspace` on the ASCII range.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

fn word(raw: &[u8]) -> Word<'_> {
    let mut text = raw;
    if let Some(rest) = text.strip_prefix(b"\"") {
        text = rest.strip_suffix(b"\"").unwrap_or(rest);
    }
    match text.iter().position(|&b| b == b'=') {
        // The kernel treats a leading `=` as no `=` at all.
        Some(eq) if eq > 0 => {
            let mut value = &text[eq + 1..];
            if let Some(rest) = value.strip_prefix(b"\"") {
                value = rest.strip_suffix(b"\"").unwrap_or(rest);
            }
            Word {
                name: &text[..eq],
                value: Some(value),
                raw,
            }
        }
        _ => Word {
            name: text,
            value: None,
            raw,
        },
    }
}

/// Whether `name` is `wanted`, with `-` and `_` the same (the kernel's `parameq`).
fn name_is(name: &[u8], wanted: &str) -> bool {
    let dash = |b: u8| if b == b'-' { b'_' } else { b };
    name.len() == wanted.len()
        && name
            .iter()
            .zip(wanted.bytes())
            .all(|(&a, b)| dash(a) == dash(b))
}

/// The `mprov_*` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Param {
    /// `mprov_ca`: the CA certificate's SHA-256.
    Ca,
    /// `mprov_enroll`: the enrollment nonce.
    Enroll,
    /// `mprov_url`: the control service.
    Url,
    /// `mprov_mac`: the MAC address that booted (the interface to bring up).
    Mac,
    /// `mprov_image`: the image and version, `<slug>:<version>`.
    Image,
    /// `mprov_rescue`: `1` drops to a rescue shell on a fatal error.
    Rescue,
    /// `mprov_lease`: the lease iPXE holds.
    Lease,
}

impl Param {
    /// Every parameter, in the order the agent reports them.
    pub const ALL: [Param; 7] = [
        Param::Enroll,
        Param::Ca,
        Param::Url,
        Param::Mac,
        Param::Lease,
        Param::Image,
        Param::Rescue,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Param::Ca => "mprov_ca",
            Param::Enroll => "mprov_enroll",
            Param::Url => "mprov_url",
            Param::Mac => "mprov_mac",
            Param::Image => "mprov_image",
            Param::Rescue => "mprov_rescue",
            Param::Lease => "mprov_lease",
        }
    }

    /// The parameter a word's name is, if any.
    pub fn from_name(name: &[u8]) -> Option<Param> {
        Param::ALL.into_iter().find(|p| name_is(name, p.name()))
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a parameter's value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ParamError {
    /// `mprov_ca` is not 64 hexadecimal digits.
    #[error("not a SHA-256 (64 hexadecimal digits)")]
    BadFingerprint,
    /// `mprov_url` is neither `http://` nor `https://`.
    #[error("not an http:// or https:// URL")]
    BadScheme,
    /// The name was given without a value, or with an empty one.
    #[error("no value")]
    Empty,
    /// A character that the value may not hold.
    #[error("invalid character (byte 0x{0:02x})")]
    InvalidCharacter(u8),
    /// `mprov_mac` is not six `:`-separated hex pairs.
    #[error("not a MAC address (aa:bb:cc:dd:ee:ff)")]
    BadMac,
    /// `mprov_image` is not `<slug>:<version>`.
    #[error("not <image slug>:<version>")]
    BadImage,
    /// `mprov_rescue` is neither `0` nor `1`.
    #[error("neither 0 nor 1")]
    BadFlag,
    /// `mprov_url` names no host.
    #[error("no host in the URL")]
    NoHost,
    /// Longer than the value may be.
    #[error("longer than {0} bytes")]
    TooLong(usize),
    /// `mprov_lease` is not a usable lease: why.
    #[error("not a usable lease ({0}); the agent asks DHCP instead")]
    BadLease(&'static str),
}

/// The checks of a free-form value, in this order: not empty, at most `max`
/// bytes, every byte `allowed`.
fn check_bytes(value: &[u8], max: usize, allowed: impl Fn(u8) -> bool) -> Result<(), ParamError> {
    if value.is_empty() {
        return Err(ParamError::Empty);
    }
    if value.len() > max {
        return Err(ParamError::TooLong(max));
    }
    match value.iter().find(|&&b| !allowed(b)) {
        Some(&bad) => Err(ParamError::InvalidCharacter(bad)),
        None => Ok(()),
    }
}

/// The checks of a fixed-size value: not empty, then exactly `len` bytes
/// (`wrong` if not).
fn check_len(value: &[u8], len: usize, wrong: ParamError) -> Result<(), ParamError> {
    if value.is_empty() {
        return Err(ParamError::Empty);
    }
    if value.len() != len {
        return Err(wrong);
    }
    Ok(())
}

/// The byte two hexadecimal digits (either case) spell; `bad` if they are
/// not digits.
fn hex_pair(high: u8, low: u8, bad: ParamError) -> Result<u8, ParamError> {
    let hex = |b: u8| (b as char).to_digit(16).ok_or(bad);
    u8::try_from(hex(high)? << 4 | hex(low)?).map_err(|_| bad)
}

/// The one-time enrollment nonce. A secret until used: its `Debug` and
/// `Display` show only [`Nonce::redacted`].
#[derive(Clone, PartialEq, Eq)]
pub struct Nonce(String);

impl Nonce {
    /// Letters, digits and `-._~` (URL-safe as is), 1 to [`MAX_NONCE_LEN`] bytes.
    pub fn parse(value: &[u8]) -> Result<Nonce, ParamError> {
        check_bytes(value, MAX_NONCE_LEN, |b| {
            b.is_ascii_alphanumeric() || b"-._~".contains(&b)
        })?;
        Ok(Nonce(String::from_utf8_lossy(value).into_owned()))
    }

    /// The nonce itself, for the enrollment request only. Never print it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// What may be printed: a short prefix (at most 4 characters and a quarter
    /// of the nonce), `…`, and the length.
    pub fn redacted(&self) -> String {
        redact(self.0.as_bytes())
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", self.redacted())
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The redacted form of a secret value, valid or not.
fn redact(value: &[u8]) -> String {
    let shown = (value.len() / 4).min(4);
    format!(
        "{}… ({} characters)",
        printable(&value[..shown]),
        value.len()
    )
}

/// The SHA-256 of the control service's CA certificate.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CaFingerprint([u8; 32]);

impl CaFingerprint {
    /// Exactly 64 hexadecimal digits, either case.
    pub fn parse(value: &[u8]) -> Result<CaFingerprint, ParamError> {
        check_len(value, 64, ParamError::BadFingerprint)?;
        let mut digest = [0; 32];
        for (byte, pair) in digest.iter_mut().zip(value.chunks_exact(2)) {
            *byte = hex_pair(pair[0], pair[1], ParamError::BadFingerprint)?;
        }
        Ok(CaFingerprint(digest))
    }

    /// The digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for CaFingerprint {
    /// Lowercase hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for CaFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaFingerprint({self})")
    }
}

/// The control service's URL: `http://` or `https://`, a host, printable
/// ASCII without spaces or quotes. A full URL parser comes with the HTTP
/// client; this only refuses what no client should be handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlUrl(String);

impl ControlUrl {
    /// Checks the value; see the type's documentation.
    pub fn parse(value: &[u8]) -> Result<ControlUrl, ParamError> {
        check_bytes(value, MAX_URL_LEN, |b| {
            b.is_ascii_graphic() && b != b'"' && b != b'\\'
        })?;
        let rest = value
            .strip_prefix(b"http://")
            .or_else(|| value.strip_prefix(b"https://"))
            .ok_or(ParamError::BadScheme)?;
        let authority = rest.split(|&b| b == b'/').next().unwrap_or_default();
        let host = authority
            .rsplit(|&b| b == b'@')
            .next()
            .unwrap_or_default()
            .split(|&b| b == b':')
            .next()
            .unwrap_or_default();
        // An IPv6 literal's colons split it above; `[` alone still counts.
        if host.is_empty() {
            return Err(ParamError::NoHost);
        }
        Ok(ControlUrl(String::from_utf8_lossy(value).into_owned()))
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ControlUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// Six hex pairs separated by `:` or `-`, either case.
    pub fn parse(value: &[u8]) -> Result<Mac, ParamError> {
        check_len(value, 17, ParamError::BadMac)?;
        let mut mac = [0u8; 6];
        for (i, byte) in mac.iter_mut().enumerate() {
            let at = i * 3;
            if i > 0 && !matches!(value[at - 1], b':' | b'-') {
                return Err(ParamError::BadMac);
            }
            *byte = hex_pair(value[at], value[at + 1], ParamError::BadMac)?;
        }
        Ok(Mac(mac))
    }
}

impl fmt::Display for Mac {
    /// Lowercase, `:`-separated, as sysfs writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// The image to boot: its slug and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The image's slug.
    pub slug: String,
    /// The version.
    pub version: i64,
}

impl ImageRef {
    /// `<slug>:<version>`: a slug of `[a-z0-9-]` (1-63), a version of 1-18
    /// digits.
    pub fn parse(value: &[u8]) -> Result<ImageRef, ParamError> {
        if value.is_empty() {
            return Err(ParamError::Empty);
        }
        let text = std::str::from_utf8(value).map_err(|_| ParamError::BadImage)?;
        let (slug, version) = text.rsplit_once(':').ok_or(ParamError::BadImage)?;
        let slug_ok = (1..=63).contains(&slug.len())
            && slug
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        let version_ok =
            (1..=18).contains(&version.len()) && version.bytes().all(|b| b.is_ascii_digit());
        if !slug_ok || !version_ok {
            return Err(ParamError::BadImage);
        }
        Ok(ImageRef {
            slug: slug.to_owned(),
            version: version.parse().map_err(|_| ParamError::BadImage)?,
        })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.slug, self.version)
    }
}

/// The lease iPXE held when it loaded the kernel, carried on the command
/// line so that the agent need not ask DHCP again: half the DHCP exchanges
/// of a mass boot, and no second chance to lose one.
///
/// Checked as a lease the agent may configure: an address and a netmask
/// (contiguous, `/1` to `/32`); the address a host's (not unspecified,
/// loopback, link-local, multicast or broadcast, nor the subnet's own or
/// broadcast address below `/31`); a gateway, if any, inside the subnet and
/// not the address itself; an MTU from 576 (as from DHCP); a domain of DNS
/// name characters.
/// An unset iPXE setting expands to nothing, so every field but the first
/// two may be empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedLease {
    /// The node's address.
    pub address: Ipv4Addr,
    /// The prefix length.
    pub prefix: u8,
    /// The default gateway.
    pub gateway: Option<Ipv4Addr>,
    /// The DNS server.
    pub dns: Option<Ipv4Addr>,
    /// The DHCP server that gave the lease.
    pub server: Option<Ipv4Addr>,
    /// The interface MTU.
    pub mtu: Option<u16>,
    /// The DNS domain.
    pub domain: Option<String>,
}

/// The fields of [`CarriedLease`], in order.
const LEASE_FIELDS: usize = 7;
/// The longest `mprov_lease` value: seven fields, a domain of 253.
const MAX_LEASE_LEN: usize = 4 * 16 + 6 + 253;

impl CarriedLease {
    /// `<address>,<netmask>,<gateway>,<dns>,<server>,<mtu>,<domain>`.
    pub fn parse(value: &[u8]) -> Result<CarriedLease, ParamError> {
        if value.iter().all(|&b| b == b',') {
            return Err(ParamError::Empty);
        }
        check_bytes(value, MAX_LEASE_LEN, |b| {
            b.is_ascii_alphanumeric() || b".,-".contains(&b)
        })?;
        let text = std::str::from_utf8(value).map_err(|_| ParamError::BadLease("not text"))?;
        let fields: Vec<&str> = text.split(',').collect();
        let [address, netmask, gateway, dns, server, mtu, domain] =
            <[&str; LEASE_FIELDS]>::try_from(fields)
                .map_err(|_| ParamError::BadLease("not seven comma-separated fields"))?;
        let ip = |field: &str, what: &'static str| -> Result<Option<Ipv4Addr>, ParamError> {
            if field.is_empty() {
                return Ok(None);
            }
            field
                .parse()
                .map(Some)
                .map_err(|_| ParamError::BadLease(what))
        };
        let address =
            ip(address, "the address is not IPv4")?.ok_or(ParamError::BadLease("no address"))?;
        let netmask =
            ip(netmask, "the netmask is not IPv4")?.ok_or(ParamError::BadLease("no netmask"))?;
        let mask = u32::from(netmask);
        if mask == 0 || mask.leading_ones() + mask.trailing_zeros() != 32 {
            return Err(ParamError::BadLease("the netmask is not contiguous"));
        }
        let prefix = u8::try_from(mask.leading_ones())
            .map_err(|_| ParamError::BadLease("the netmask is not contiguous"))?;
        let lease = CarriedLease {
            address,
            prefix,
            gateway: ip(gateway, "the gateway is not IPv4")?,
            dns: ip(dns, "the DNS server is not IPv4")?,
            server: ip(server, "the DHCP server is not IPv4")?,
            mtu: match mtu {
                "" => None,
                m => Some(
                    m.parse::<u16>()
                        .ok()
                        .filter(|&m| m >= 576)
                        .ok_or(ParamError::BadLease("the MTU is not 576 to 65535"))?,
                ),
            },
            domain: match domain {
                "" => None,
                d if d.split('.').all(|l| !l.is_empty() && l.len() <= 63) => Some(d.to_owned()),
                _ => return Err(ParamError::BadLease("the domain is not a DNS name")),
            },
        };
        lease.check()?;
        Ok(lease)
    }

    /// The checks of an address the agent may configure (see the type).
    fn check(&self) -> Result<(), ParamError> {
        let a = self.address;
        if a.is_unspecified()
            || a.is_loopback()
            || a.is_link_local()
            || a.is_multicast()
            || a.is_broadcast()
        {
            return Err(ParamError::BadLease("the address is not a host's"));
        }
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        let net = u32::from(a) & mask;
        if self.prefix < 31 && (u32::from(a) == net || u32::from(a) == net | !mask) {
            return Err(ParamError::BadLease(
                "the address is its subnet's own or broadcast address",
            ));
        }
        if let Some(g) = self.gateway
            && (g == a || u32::from(g) & mask != net)
        {
            return Err(ParamError::BadLease(
                "the gateway is not another address of the subnet",
            ));
        }
        Ok(())
    }

    /// The netmask of [`Self::prefix`].
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(
            u32::MAX
                .checked_shl(32 - u32::from(self.prefix))
                .unwrap_or(0),
        )
    }
}

impl fmt::Display for CarriedLease {
    /// The form [`CarriedLease::parse`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn opt(v: Option<impl fmt::Display>) -> String {
            v.map(|v| v.to_string()).unwrap_or_default()
        }
        write!(
            f,
            "{},{},{},{},{},{},{}",
            self.address,
            self.netmask(),
            opt(self.gateway),
            opt(self.dns),
            opt(self.server),
            opt(self.mtu),
            self.domain.as_deref().unwrap_or_default()
        )
    }
}

/// `0` or `1`.
fn parse_flag(value: &[u8]) -> Result<bool, ParamError> {
    match value {
        b"" => Err(ParamError::Empty),
        b"1" => Ok(true),
        b"0" => Ok(false),
        _ => Err(ParamError::BadFlag),
    }
}

/// The `mprov_*` parameters of a command line, each present, absent or
/// refused (with why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootParams {
    enroll: Option<Result<Nonce, ParamError>>,
    ca: Option<Result<CaFingerprint, ParamError>>,
    url: Option<Result<ControlUrl, ParamError>>,
    mac: Option<Result<Mac, ParamError>>,
    image: Option<Result<ImageRef, ParamError>>,
    rescue: Option<Result<bool, ParamError>>,
    lease: Option<Result<CarriedLease, ParamError>>,
}

impl BootParams {
    /// Reads the parameters from a command line; never fails as a whole.
    pub fn parse(line: &[u8]) -> BootParams {
        let mut params = BootParams::default();
        for word in words(line) {
            let Some(param) = Param::from_name(word.name) else {
                continue;
            };
            let value = word.value.unwrap_or_default();
            match param {
                Param::Ca => params.ca = Some(CaFingerprint::parse(value)),
                Param::Enroll => params.enroll = Some(Nonce::parse(value)),
                Param::Url => params.url = Some(ControlUrl::parse(value)),
                Param::Mac => params.mac = Some(Mac::parse(value)),
                Param::Image => params.image = Some(ImageRef::parse(value)),
                Param::Rescue => params.rescue = Some(parse_flag(value)),
                Param::Lease => params.lease = Some(CarriedLease::parse(value)),
            }
        }
        params
    }

    /// The enrollment nonce, if given and valid.
    pub fn enroll(&self) -> Option<&Nonce> {
        self.enroll.as_ref()?.as_ref().ok()
    }

    /// The CA certificate's SHA-256, if given and valid.
    pub fn ca(&self) -> Option<&CaFingerprint> {
        self.ca.as_ref()?.as_ref().ok()
    }

    /// The control service's URL, if given and valid.
    pub fn url(&self) -> Option<&ControlUrl> {
        self.url.as_ref()?.as_ref().ok()
    }

    /// The MAC that booted, if given and valid.
    pub fn mac(&self) -> Option<Mac> {
        self.mac.as_ref()?.as_ref().ok().copied()
    }

    /// The image to boot, if given and valid.
    pub fn image(&self) -> Option<&ImageRef> {
        self.image.as_ref()?.as_ref().ok()
    }

    /// The lease iPXE carried, or why there is none to use (absent:
    /// `Err(ParamError::Empty)`).
    pub fn lease(&self) -> Result<&CarriedLease, ParamError> {
        match &self.lease {
            None => Err(ParamError::Empty),
            Some(Ok(lease)) => Ok(lease),
            Some(Err(err)) => Err(*err),
        }
    }

    /// Whether a fatal error drops to a rescue shell (`mprov_rescue=1`).
    pub fn rescue(&self) -> bool {
        matches!(self.rescue, Some(Ok(true)))
    }

    /// The parameters given with a value that was refused.
    pub fn errors(&self) -> Vec<(Param, ParamError)> {
        Param::ALL
            .into_iter()
            .filter_map(|p| match self.status(p) {
                Status::Refused(err) => Some((p, err)),
                _ => None,
            })
            .collect()
    }

    /// One line a parameter for the console, in [`Param::ALL`] order, e.g.
    /// `mprov_url: http://10.0.0.1:8080`. The nonce is redacted.
    pub fn report(&self) -> Vec<String> {
        Param::ALL
            .into_iter()
            .map(|p| {
                let status = match self.status(p) {
                    Status::Absent => "not given".to_owned(),
                    Status::Refused(err) => format!("refused: {err}"),
                    Status::Valid(value) => value,
                };
                format!("{p}: {status}")
            })
            .collect()
    }

    fn status(&self, param: Param) -> Status {
        fn of<T>(slot: &Option<Result<T, ParamError>>, show: impl Fn(&T) -> String) -> Status {
            match slot {
                None => Status::Absent,
                Some(Err(err)) => Status::Refused(*err),
                Some(Ok(value)) => Status::Valid(show(value)),
            }
        }
        match param {
            Param::Ca => of(&self.ca, ToString::to_string),
            Param::Enroll => of(&self.enroll, Nonce::redacted),
            Param::Url => of(&self.url, ToString::to_string),
            Param::Mac => of(&self.mac, ToString::to_string),
            Param::Image => of(&self.image, ToString::to_string),
            Param::Rescue => of(&self.rescue, |on| if *on { "1" } else { "0" }.to_owned()),
            Param::Lease => of(&self.lease, ToString::to_string),
        }
    }
}

enum Status {
    Absent,
    Refused(ParamError),
    Valid(String),
}

/// The command line for the console: each word as written, printable, except
/// that the value of `mprov_enroll` (valid or not) is redacted.
pub fn redacted(line: &[u8]) -> String {
    let mut out = String::new();
    for word in words(line) {
        if !out.is_empty() {
            out.push(' ');
        }
        match word.value {
            Some(value) if Param::from_name(word.name) == Some(Param::Enroll) => {
                out.push_str(&printable(word.name));
                out.push('=');
                out.push_str(&redact(value));
            }
            _ => out.push_str(&printable(word.raw)),
        }
    }
    out
}

/// `bytes` with everything but printable ASCII and spaces as `\xNN`, so that a
/// hostile line cannot send escape sequences to the console.
pub fn printable(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b == b' ' || b.is_ascii_graphic() {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";

    /// `(name, value)` of each word, lossily, for table tests.
    fn split(line: &str) -> Vec<(String, Option<String>)> {
        words(line.as_bytes())
            .map(|w| {
                (
                    String::from_utf8_lossy(w.name).into_owned(),
                    w.value.map(|v| String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect()
    }

    #[test]
    fn words_split_like_the_kernel() {
        let check = |line: &str, expected: &[(&str, Option<&str>)]| {
            let expected: Vec<_> = expected
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.map(str::to_owned)))
                .collect();
            assert_eq!(split(line), expected, "{line:?}");
        };
        check("", &[]);
        check(" \t\n ", &[]);
        check(
            "console=ttyS0 quiet  panic=-1\n",
            &[
                ("console", Some("ttyS0")),
                ("quiet", None),
                ("panic", Some("-1")),
            ],
        );
        // Quotes group words and are removed around the value or the word.
        check(r#"a="b c" d"#, &[("a", Some("b c")), ("d", None)]);
        check(r#""a=b c" d"#, &[("a", Some("b c")), ("d", None)]);
        check(r#"a="" b="#, &[("a", Some("")), ("b", Some(""))]);
        // Quotes inside a value stay; an unclosed quote runs to the end.
        check(r#"a=b"c d"e"#, &[("a", Some(r#"b"c d"e"#))]);
        check(r#"a="b c"#, &[("a", Some("b c"))]);
        check(r#"""#, &[("", None)]);
        // The name ends at the first `=`; a leading `=` is no `=`.
        check("a=b=c =d", &[("a", Some("b=c")), ("=d", None)]);
    }

    #[test]
    fn the_lab_line_parses() {
        let line = format!(
            "console=ttyS0 panic=-1 mprov_enroll=abc123 mprov_ca={CA} mprov_url=http://10.99.0.1:8080\n"
        );
        let params = BootParams::parse(line.as_bytes());
        assert_eq!(params.enroll().map(Nonce::expose_secret), Some("abc123"));
        assert_eq!(
            params.ca().map(ToString::to_string).as_deref(),
            Some(CA.to_ascii_lowercase().as_str())
        );
        assert_eq!(params.ca().map(|c| c.as_bytes()[31]), Some(0xff));
        assert_eq!(
            params.url().map(ControlUrl::as_str),
            Some("http://10.99.0.1:8080")
        );
        assert!(params.errors().is_empty());
        assert_eq!(
            params.report(),
            [
                "mprov_enroll: a… (6 characters)".to_owned(),
                format!("mprov_ca: {}", CA.to_ascii_lowercase()),
                "mprov_url: http://10.99.0.1:8080".to_owned(),
                "mprov_mac: not given".to_owned(),
                "mprov_lease: not given".to_owned(),
                "mprov_image: not given".to_owned(),
                "mprov_rescue: not given".to_owned(),
            ]
        );
    }

    #[test]
    fn mac_image_and_rescue() {
        let params = BootParams::parse(
            b"mprov_mac=52:54:00:AB:cd:01 mprov_image=compute-gpu:12 mprov_rescue=1",
        );
        assert_eq!(params.mac(), Some(Mac([0x52, 0x54, 0, 0xab, 0xcd, 1])));
        assert_eq!(
            params.mac().map(|m| m.to_string()).as_deref(),
            Some("52:54:00:ab:cd:01")
        );
        assert_eq!(
            params.image(),
            Some(&ImageRef {
                slug: "compute-gpu".to_owned(),
                version: 12
            })
        );
        assert!(params.rescue());
        assert!(!BootParams::parse(b"mprov_rescue=0").rescue());
        assert!(!BootParams::parse(b"").rescue());
        let check = |line: &[u8], param: Param, err: ParamError| {
            assert_eq!(
                BootParams::parse(line).errors(),
                [(param, err)],
                "{}",
                printable(line)
            );
        };
        check(b"mprov_mac=52:54:00:ab:cd", Param::Mac, ParamError::BadMac);
        check(
            b"mprov_mac=52:54:00:ab:cd:0g",
            Param::Mac,
            ParamError::BadMac,
        );
        check(
            b"mprov_mac=52.54.00.ab.cd.01",
            Param::Mac,
            ParamError::BadMac,
        );
        check(b"mprov_image=compute", Param::Image, ParamError::BadImage);
        check(b"mprov_image=Compute:1", Param::Image, ParamError::BadImage);
        check(
            b"mprov_image=compute:-1",
            Param::Image,
            ParamError::BadImage,
        );
        check(b"mprov_rescue=yes", Param::Rescue, ParamError::BadFlag);
    }

    #[test]
    fn quoted_and_dashed_names_count() {
        let params = BootParams::parse(br#""mprov-enroll=n0nce-1" mprov_url="https://ctl.lab/""#);
        assert_eq!(params.enroll().map(Nonce::expose_secret), Some("n0nce-1"));
        assert_eq!(
            params.url().map(ControlUrl::as_str),
            Some("https://ctl.lab/")
        );
        assert_eq!(params.ca(), None);
    }

    #[test]
    fn the_last_occurrence_counts() {
        let params = BootParams::parse(b"mprov_enroll=first mprov_enroll=second");
        assert_eq!(params.enroll().map(Nonce::expose_secret), Some("second"));
        // Even when the last one is refused: the line's author meant it.
        let params = BootParams::parse(b"mprov_url=http://a mprov_url=ftp://b");
        assert_eq!(params.url(), None);
        assert_eq!(params.errors(), [(Param::Url, ParamError::BadScheme)]);
        let params = BootParams::parse(b"mprov_url=ftp://b mprov_url=http://a");
        assert_eq!(params.url().map(ControlUrl::as_str), Some("http://a"));
        assert!(params.errors().is_empty());
    }

    #[test]
    fn missing_values_are_refused_and_absent_ones_are_not_errors() {
        let params = BootParams::parse(b"mprov_enroll mprov_ca= mprov_url=\"\"");
        assert_eq!(
            params.errors(),
            [
                (Param::Enroll, ParamError::Empty),
                (Param::Ca, ParamError::Empty),
                (Param::Url, ParamError::Empty),
            ]
        );
        assert_eq!(
            params.report(),
            [
                "mprov_enroll: refused: no value",
                "mprov_ca: refused: no value",
                "mprov_url: refused: no value",
                "mprov_mac: not given",
                "mprov_lease: not given",
                "mprov_image: not given",
                "mprov_rescue: not given",
            ]
        );
        let params = BootParams::parse(b"console=ttyS0 mprov_other=1 mprov_enrollx=1 mprov");
        assert_eq!(params, BootParams::default());
        assert!(params.errors().is_empty());
        assert_eq!(params.report()[0], "mprov_enroll: not given");
    }

    /// The lease as iPXE expands `mprov_ipxe::LEASE_ARG`: whole, with unset
    /// settings empty, and refused (so DHCP it is) when it is not one a
    /// host can configure.
    #[test]
    fn a_carried_lease_is_read_and_checked() {
        let params = BootParams::parse(
            b"mprov_lease=10.99.0.41,255.255.255.0,10.99.0.1,10.99.0.2,10.99.0.2,1500,lab.example",
        );
        let lease = params.lease().expect("lease");
        assert_eq!(
            *lease,
            CarriedLease {
                address: Ipv4Addr::new(10, 99, 0, 41),
                prefix: 24,
                gateway: Some(Ipv4Addr::new(10, 99, 0, 1)),
                dns: Some(Ipv4Addr::new(10, 99, 0, 2)),
                server: Some(Ipv4Addr::new(10, 99, 0, 2)),
                mtu: Some(1500),
                domain: Some("lab.example".to_owned()),
            }
        );
        assert_eq!(
            params.report()[4],
            "mprov_lease: 10.99.0.41,255.255.255.0,10.99.0.1,10.99.0.2,10.99.0.2,1500,lab.example"
        );
        // Unset settings expand to nothing.
        let bare = CarriedLease::parse(b"10.0.0.5,255.255.0.0,,,,,").expect("bare");
        assert_eq!((bare.prefix, bare.gateway, bare.mtu), (16, None, None));
        assert_eq!(bare.to_string(), "10.0.0.5,255.255.0.0,,,,,");
        assert_eq!(
            CarriedLease::parse(b"192.0.2.7,255.255.255.255,,,,,")
                .expect("/32")
                .prefix,
            32
        );
        // No lease at all: iPXE had none on net0, or an old script.
        assert_eq!(BootParams::parse(b"").lease(), Err(ParamError::Empty));
        assert_eq!(
            BootParams::parse(b"mprov_lease=,,,,,,").lease(),
            Err(ParamError::Empty)
        );
        for (bad, why) in [
            ("10.0.0.5,255.255.255.0", "not seven comma-separated fields"),
            (
                "10.0.0.5,255.255.255.0,,,,,,",
                "not seven comma-separated fields",
            ),
            (",255.255.255.0,,,,,", "no address"),
            ("10.0.0.5,,,,,,", "no netmask"),
            ("10.0.0.300,255.255.255.0,,,,,", "the address is not IPv4"),
            ("10.0.0.5,255.0.255.0,,,,,", "the netmask is not contiguous"),
            ("10.0.0.5,0.0.0.0,,,,,", "the netmask is not contiguous"),
            ("0.0.0.0,255.255.255.0,,,,,", "the address is not a host's"),
            ("127.0.0.1,255.0.0.0,,,,,", "the address is not a host's"),
            (
                "169.254.3.4,255.255.0.0,,,,,",
                "the address is not a host's",
            ),
            (
                "224.0.0.9,255.255.255.0,,,,,",
                "the address is not a host's",
            ),
            (
                "10.0.0.0,255.255.255.0,,,,,",
                "the address is its subnet's own or broadcast address",
            ),
            (
                "10.0.0.255,255.255.255.0,,,,,",
                "the address is its subnet's own or broadcast address",
            ),
            (
                "10.0.0.5,255.255.255.0,10.0.1.1,,,,",
                "the gateway is not another address of the subnet",
            ),
            (
                "10.0.0.5,255.255.255.0,10.0.0.5,,,,",
                "the gateway is not another address of the subnet",
            ),
            ("10.0.0.5,255.255.255.0,,x,,,", "the DNS server is not IPv4"),
            (
                "10.0.0.5,255.255.255.0,,,,575,",
                "the MTU is not 576 to 65535",
            ),
            (
                "10.0.0.5,255.255.255.0,,,,,a..b",
                "the domain is not a DNS name",
            ),
        ] {
            assert_eq!(
                CarriedLease::parse(bad.as_bytes()),
                Err(ParamError::BadLease(why)),
                "{bad}"
            );
        }
        // What iPXE writes for a setting it cannot show is not a lease.
        assert_eq!(
            CarriedLease::parse(b"10.0.0.5,255.255.255.0,${net0/gateway},,,,"),
            Err(ParamError::InvalidCharacter(b'$'))
        );
        // A /31 has no subnet or broadcast address of its own.
        assert!(CarriedLease::parse(b"10.0.0.0,255.255.255.254,10.0.0.1,,,,").is_ok());
    }

    #[test]
    fn bad_values_say_why() {
        let check = |line: &[u8], param: Param, err: ParamError| {
            let params = BootParams::parse(line);
            assert_eq!(params.errors(), [(param, err)], "{}", printable(line));
        };
        check(b"mprov_ca=abc", Param::Ca, ParamError::BadFingerprint);
        let not_hex = format!("mprov_ca={}", "g".repeat(64));
        check(not_hex.as_bytes(), Param::Ca, ParamError::BadFingerprint);
        let plus = format!("mprov_ca=+{}", "0".repeat(63));
        check(plus.as_bytes(), Param::Ca, ParamError::BadFingerprint);
        check(
            b"mprov_enroll=a/b",
            Param::Enroll,
            ParamError::InvalidCharacter(b'/'),
        );
        check(
            b"mprov_enroll=\xff\xfe",
            Param::Enroll,
            ParamError::InvalidCharacter(0xff),
        );
        let long = format!("mprov_enroll={}", "a".repeat(MAX_NONCE_LEN + 1));
        check(
            long.as_bytes(),
            Param::Enroll,
            ParamError::TooLong(MAX_NONCE_LEN),
        );
        check(b"mprov_url=10.0.0.1:80", Param::Url, ParamError::BadScheme);
        check(b"mprov_url=http:///x", Param::Url, ParamError::NoHost);
        check(b"mprov_url=https://u@:1/", Param::Url, ParamError::NoHost);
        check(
            b"mprov_url=\"http://a b\"",
            Param::Url,
            ParamError::InvalidCharacter(b' '),
        );
        check(
            b"mprov_url=http://a\x1b[2J",
            Param::Url,
            ParamError::InvalidCharacter(0x1b),
        );
        assert_eq!(
            ParamError::InvalidCharacter(0x1b).to_string(),
            "invalid character (byte 0x1b)"
        );
    }

    #[test]
    fn junk_bytes_neither_panic_nor_leak() {
        let junk: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let params = BootParams::parse(&junk);
        assert_eq!(params, BootParams::default());
        let shown = redacted(&junk);
        assert!(
            shown.bytes().all(|b| b == b' ' || b.is_ascii_graphic()),
            "{shown}"
        );
        let mut line = b"\x00 \"mprov_enroll=secretnonce\x01\" \xc3\x28 ".to_vec();
        line.extend_from_slice(&junk);
        assert!(!redacted(&line).contains("secretnonce"));
    }

    #[test]
    fn the_nonce_is_never_printed_whole() {
        let nonce = Nonce::parse(b"0123456789abcdefXYZ").expect("valid");
        assert_eq!(nonce.redacted(), "0123… (19 characters)");
        assert_eq!(format!("{nonce}"), "0123… (19 characters)");
        assert_eq!(format!("{nonce:?}"), "Nonce(0123… (19 characters))");
        let params = BootParams::parse(b"mprov_enroll=0123456789abcdefXYZ");
        assert!(!format!("{params:?}").contains("456789"));
        assert_eq!(
            redacted(b"console=ttyS0  \"mprov-enroll=abcdefgh\" mprov_enroll=x/y a=\"b c\"\x1b"),
            "console=ttyS0 mprov-enroll=ab… (8 characters) mprov_enroll=… (3 characters) a=\"b c\"\\x1b"
        );
    }
}
