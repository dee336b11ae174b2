//! Fuzzing entry points for the agent's parsers of untrusted bytes, shared
//! by the cargo-fuzz targets (`tests/fuzz/fuzz_targets/agent_*.rs`) and the
//! stable tests below, which replay `tests/fuzz/corpus/agent_*/` on every
//! `cargo test`:
//! - [`agent_cmdline`]: the kernel command line;
//! - [`agent_http_head`]: a job server's reply head, as the image stream
//!   classifies it;
//! - [`agent_manifest`]: the boot manifest's JSON;
//! - [`agent_dhcp`]: a DHCP reply, fed to the client's state machine;
//! - [`agent_tar`]: a tar stream, unpacked into a scratch root;
//! - [`agent_script_plan`]: a script plan's JSON, ordered into layers.
//!
//! For the command line, besides "no panic" it checks, for every input:
//! - the parameters it accepts, written out plainly, parse back to
//!   themselves (what the control service will write, we read);
//! - the console form of the line is printable, and of a word the kernel
//!   sees as `mprov_enroll=<value>` it shows only a short prefix.

use std::time::{Duration, SystemTime};

use crate::cmdline::{self, BootParams, Param};
use crate::image::reply::{self, Reply};

/// The fuzz target: any bytes as a kernel command line.
pub fn agent_cmdline(data: &[u8]) {
    let params = BootParams::parse(data);

    let mut plain = String::new();
    if let Some(nonce) = params.enroll() {
        plain.push_str(&format!(" mprov_enroll={}", nonce.expose_secret()));
    }
    if let Some(ca) = params.ca() {
        plain.push_str(&format!(" mprov_ca={ca}"));
    }
    if let Some(url) = params.url() {
        plain.push_str(&format!(" mprov_url={url}"));
    }
    if let Some(mac) = params.mac() {
        plain.push_str(&format!(" mprov_mac={mac}"));
    }
    if let Some(image) = params.image() {
        plain.push_str(&format!(" mprov_image={image}"));
    }
    if params.rescue() {
        plain.push_str(" mprov_rescue=1");
    }
    if let Ok(lease) = params.lease() {
        plain.push_str(&format!(" mprov_lease={lease}"));
    }
    let again = BootParams::parse(plain.as_bytes());
    assert_eq!(again.mac(), params.mac());
    assert_eq!(again.image(), params.image());
    assert_eq!(again.rescue(), params.rescue());
    assert_eq!(again.enroll(), params.enroll());
    assert_eq!(again.ca(), params.ca());
    assert_eq!(again.url(), params.url());
    assert_eq!(again.lease().ok(), params.lease().ok());
    assert!(again.errors().is_empty(), "{:?}", again.errors());

    // `…` is the only character outside printable ASCII the console sees.
    let shown = cmdline::redacted(data);
    assert!(
        shown
            .chars()
            .all(|c| c == ' ' || c.is_ascii_graphic() || c == '…'),
        "{shown:?}"
    );
    // Of a nonce, at most a quarter and at most 4 bytes are shown.
    for word in cmdline::words(data) {
        let Some(value) = word.value else { continue };
        if Param::from_name(word.name) != Some(Param::Enroll) {
            continue;
        }
        let shown = cmdline::redacted(word.raw);
        let name = format!("{}=", cmdline::printable(word.name));
        let rest = shown
            .strip_prefix(&name)
            .unwrap_or_else(|| panic!("{shown:?}"));
        let (prefix, tail) = rest.split_once('…').unwrap_or_else(|| panic!("{shown:?}"));
        assert_eq!(tail, format!(" ({} characters)", value.len()));
        let revealed = (value.len() / 4).min(4);
        assert_eq!(prefix, cmdline::printable(&value[..revealed]));
    }
}

/// The fuzz target: a reply head (status line and headers, as `httparse`
/// reads them), classified for a request from an offset and for a size
/// taken from the first 16 bytes.
///
/// Checks: a body starts exactly where we asked; a wait never exceeds the
/// cap; a `Content-Range` that parses is ordered and within its total.
pub fn agent_http_head(data: &[u8]) {
    let take = |at: usize| {
        data.get(at..at + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let (asked_from, size) = (take(0) % (1 << 40), take(8) % (1 << 40));
    let head = data.get(16..).unwrap_or_default();
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = response.parse(head) else {
        return;
    };
    let Some(status) = response.code else { return };
    let lookup = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    match reply::classify(status, lookup, asked_from, size, now) {
        Reply::Body { start, validator } => {
            assert_eq!(start, if status == 200 { 0 } else { asked_from });
            assert!(validator.is_none_or(|v| v.bytes().all(|b| b.is_ascii_graphic())));
        }
        Reply::Busy { wait } => assert!(wait <= reply::MAX_RETRY_AFTER),
        Reply::Refused { reason } => assert!(!reason.is_empty()),
    }
    for header in response.headers.iter() {
        if let Some(range) = reply::parse_content_range(header.value) {
            assert!(range.start <= range.end);
            assert!(range.total.is_none_or(|t| range.end < t));
        }
        let _ = reply::parse_retry_after(header.value, now);
    }
}

/// The fuzz target: the boot manifest's JSON. Checks: an accepted manifest
/// has a non-empty image, only http(s) sources, and its sha256 written out
/// again is the one it came with.
pub fn agent_manifest(data: &[u8]) {
    let Ok(checked) = crate::manifest::parse(data) else {
        return;
    };
    assert!(checked.expected.size > 0);
    assert!(!checked.sources.is_empty());
    assert!(
        checked
            .sources
            .iter()
            .all(|s| s.starts_with("http://") || s.starts_with("https://"))
    );
    assert!(crate::manifest::hostname_ok(&checked.hostname));
    let manifest: mprov_api::boot::BootManifest =
        serde_json::from_slice(data).expect("accepted, so it parsed");
    assert_eq!(
        hex::encode(checked.expected.sha256),
        manifest.sha256.to_ascii_lowercase()
    );
}

/// The fuzz target: a datagram as a reply to each state of the DHCP client
/// (the first 4 bytes pick the transaction id the client uses, so a corpus
/// file can match it). Checks: a lease the client binds has a usable
/// address and a prefix of at most 32; no reply makes it send anything but
/// a decodable DHCP message.
pub fn agent_dhcp(data: &[u8]) {
    use dhcproto::Decodable;

    use crate::dhcp::{Action, Client};
    let xid = data
        .get(..4)
        .map_or(0, |b| u32::from_be_bytes(b.try_into().unwrap_or([0; 4])));
    let packet = data.get(4..).unwrap_or_default();
    let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
    let check = |action: Action| match action {
        Action::Send(bytes, _) => {
            dhcproto::v4::Message::from_bytes(&bytes).expect("what we send decodes");
        }
        Action::Bound(lease) => {
            assert!(lease.prefix <= 32 && lease.prefix > 0);
            assert!(!lease.address.is_unspecified() && !lease.address.is_broadcast());
        }
        Action::Wait | Action::GiveUp => {}
    };
    let (mut client, _) = Client::new(mac, xid);
    check(client.received(packet));
    // And again, in whatever state that left it (Requesting, if an offer).
    check(client.received(packet));
}

/// The fuzz target: a tar stream unpacked into a scratch root beside an
/// empty sibling folder. Checks: whatever the stream says (`..`, absolute
/// links, links through symlinks), nothing appears outside the root.
pub fn agent_tar(data: &[u8]) {
    let Ok(dir) = tempfile_dir() else { return };
    let root = dir.join("root");
    let outside = dir.join("outside");
    let made = std::fs::create_dir(&root).and_then(|()| std::fs::create_dir(&outside));
    if made.is_ok() {
        let options = mprov_unpack::UnpackOptions {
            whiteouts: data.first().is_some_and(|b| b & 1 == 1),
            preserve_owner: false,
        };
        let _ = mprov_unpack::unpack(data, &root, options);
        let escaped = std::fs::read_dir(&outside).map_or(0, |d| d.count());
        let siblings = std::fs::read_dir(&dir).map_or(0, |d| d.count());
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(escaped, 0, "an entry was written outside the root");
        assert_eq!(siblings, 2, "an entry was written beside the root");
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The fuzz target: any bytes as the control service's script plan, parsed
/// and ordered. Checks, for a plan that parses:
/// - accepted: every script that is not disabled is in exactly one layer,
///   after every layer holding one of its dependencies, and no disabled
///   script runs; each layer is sorted by slug; every warning names a
///   disabled slug;
/// - refused: at least one problem, and every script it names is in the
///   plan.
pub fn agent_script_plan(data: &[u8]) {
    use std::collections::{BTreeMap, BTreeSet};
    let Ok(plan) = crate::scripts::parse_plan(data) else {
        return;
    };
    let disabled: BTreeSet<&str> = plan.disabled.iter().map(String::as_str).collect();
    let listed: BTreeSet<&str> = plan.scripts.iter().map(|s| s.slug.as_str()).collect();
    match crate::scripts::plan::plan(&plan) {
        Ok(layers) => {
            let mut layer_of = BTreeMap::new();
            for (n, layer) in layers.layers.iter().enumerate() {
                assert!(layer.windows(2).all(|w| w[0].slug < w[1].slug));
                for script in layer {
                    assert!(!disabled.contains(script.slug.as_str()));
                    assert!(layer_of.insert(script.slug.as_str(), n).is_none());
                }
            }
            for script in &plan.scripts {
                if disabled.contains(script.slug.as_str()) {
                    continue;
                }
                let n = layer_of[script.slug.as_str()];
                for dep in &script.depends_on {
                    assert!(layer_of[dep.as_str()] < n, "{} after {dep}", script.slug);
                }
            }
            assert_eq!(layer_of.len(), listed.difference(&disabled).count());
            for warning in &layers.warnings {
                assert!(disabled.iter().any(|d| warning.starts_with(d)));
            }
        }
        Err(refusal) => {
            assert!(!refusal.0.is_empty());
            for slug in refusal.slugs() {
                assert!(listed.contains(slug), "{slug} is not in the plan");
            }
        }
    }
}

/// A fresh scratch folder under the system's temporary folder.
fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mprov-agent-fuzz-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Replays a fuzz corpus (seeds and what the fuzzer kept) on stable,
    /// with every truncation of each file (every 64th for long files).
    fn replay(target: &str, run: fn(&[u8]), min: usize) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fuzz/corpus")
            .join(target);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("the {target} corpus: {e}"))
        {
            let data = std::fs::read(entry.expect("entry").path()).expect("read");
            let step = if data.len() > 4096 { 64 } else { 1 };
            for len in (0..data.len()).step_by(step).chain([data.len()]) {
                run(&data[..len]);
            }
            n += 1;
        }
        assert!(n >= min, "the {target} corpus has only {n} files");
    }

    #[test]
    fn fuzz_corpus_replays() {
        replay("agent_cmdline", agent_cmdline, 5);
    }

    #[test]
    fn fuzz_http_head_corpus_replays() {
        replay("agent_http_head", agent_http_head, 4);
    }

    #[test]
    fn fuzz_manifest_corpus_replays() {
        replay("agent_manifest", agent_manifest, 2);
    }

    #[test]
    fn fuzz_dhcp_corpus_replays() {
        replay("agent_dhcp", agent_dhcp, 2);
    }

    #[test]
    fn fuzz_script_plan_corpus_replays() {
        replay("agent_script_plan", agent_script_plan, 4);
    }

    #[test]
    fn fuzz_tar_corpus_replays() {
        replay("agent_tar", agent_tar, 2);
    }
}
