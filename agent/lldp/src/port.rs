//! One comparable form for the many spellings of a switch port.
//!
//! A switch names its port in LLDP one way (NX-OS says `Ethernet1/1` in the
//! port ID, IOS `Gi1/0/1`, and the description may say
//! `GigabitEthernet1/0/1`), and an admin who records the cabling may write
//! it another (`Eth1/1`, `gi1/0/01`). [`normalise_port`] maps each to one
//! form so that the control service compares like with like. The rule:
//!
//! 1. White space goes, wherever it is (`port 1` is `port1`, and a name
//!    split by a stray space or form feed is one name); letters become
//!    lower case. A MAC address (six hex pairs joined by `:` or `-`) is
//!    left at that.
//! 2. A Junos name (`ge-`, `xe-`, `et-`, `fe-`, `mge-` then FPC/PIC/port)
//!    keeps its media prefix and dash: `ge-0/0/1`.
//! 3. Otherwise a leading word (letters, an optional dash after it) that is a known long or short name of one media type becomes
//!    that type's short token:
//!    `ethernet`, `eth`, `et` → `eth`;
//!    `gigabitethernet`, `gige`, `gig`, `gi` → `gi`;
//!    `tengigabitethernet`, `tengige`, `ten`, `te` → `te`;
//!    `twentyfivegige`, `twentyfivegigabitethernet`, `twe` → `twe`;
//!    `fortygigabitethernet`, `fortygige`, `fo` → `fo`;
//!    `hundredgigabitethernet`, `hundredgige`, `hu` → `hu`;
//!    `fastethernet`, `fa` → `fa`;
//!    `port`, `interface` → nothing (`port 1` is `1`).
//!    Any other word (`swp`, `enp`, `mgmt`) stays as it is.
//! 4. In the rest, every run of digits loses its leading zeros (`01` is
//!    `1`, `0` stays `0`); the separators `/`, `.`
//!    (sub-interface), `:` (breakout) and any other character stay.
//!
//! So `Ethernet1/1`, `Eth1/1`, `eth 1/01` and `Et1/1` are all `eth1/1`;
//! `GigabitEthernet1/0/1` and `Gi1/0/1` are `gi1/0/1`;
//! `TenGigabitEthernet1/1` and `Te1/1` are `te1/1`; `port 1`, `Port1` and
//! `1` are `1`; `swp1` is `swp1`; `1/1/1` is `1/1/1`.
//!
//! Deliberately not merged, because on one switch they name different
//! ports (or cannot be told apart safely):
//! - different speeds or media: `Gi1/0/1` and `Te1/0/1` are two ports on a
//!   Catalyst, and Junos `ge-0/0/1` and `xe-0/0/1` differ too;
//! - a Junos name and another vendor's: `et-0/0/1` (a Junos 40/100G port)
//!   is not Arista's `Et0/0/1` (`eth0/0/1`);
//! - a typed name and a bare path: `Ethernet1/1` is not `1/1`, since a
//!   bare path could be any media type (but `port 1` is `1`, the word
//!   saying nothing about media);
//! - paths of another depth: `1/1` is not `1/1/1`;
//! - MAC addresses and other non-name port IDs: they are compared as the
//!   lower-case text they are (`52:54:00:aa:00:01`), never as names.

/// The comparable form of a switch port's name (see the module's rules).
pub fn normalise_port(name: &str) -> String {
    let lower: String = name
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if is_mac(&lower) {
        return lower;
    }
    if let Some((prefix, rest)) = lower.split_once('-')
        && JUNOS.contains(&prefix)
        && rest.starts_with(|c: char| c.is_ascii_digit())
    {
        return format!("{prefix}-{}", path(rest));
    }
    let word_end = lower
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(lower.len());
    let (word, rest) = lower.split_at(word_end);
    let after = rest.strip_prefix('-').unwrap_or(rest);
    let token = MEDIA
        .iter()
        .find(|(_, names)| names.contains(&word))
        .map(|(token, _)| *token);
    match token {
        Some(token) if !word.is_empty() && after.starts_with(|c: char| c.is_ascii_digit()) => {
            format!("{token}{}", path(after))
        }
        _ => format!("{word}{}", path(rest)),
    }
}

/// A port name's comparable form split in two: its media word (a
/// [`normalise_port`] token such as `eth` or `gi`, a Junos prefix such as
/// `ge`, another word such as `swp`, or nothing for a bare path or `port
/// N`) and its path (`1/1`, `0/0/1:2`). A name with no digit, and a MAC
/// address, is all word and no path: it compares only as a whole.
///
/// The control service matches a port heard over LLDP to the one an
/// admin typed on these parts: the same path and the same word, or the
/// same path where one side names no media (`1/1` typed, `Ethernet1/1`
/// heard).
pub fn port_parts(name: &str) -> (String, String) {
    let form = normalise_port(name);
    if is_mac(&form) {
        return (form, String::new());
    }
    let split = form
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(form.len());
    let (word, path) = form.split_at(split);
    let word = word.strip_suffix('-').unwrap_or(word);
    (word.to_owned(), path.to_owned())
}

/// Six hex pairs joined by `:` or `-`.
fn is_mac(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 17
        && bytes.iter().enumerate().all(|(i, b)| {
            if i % 3 == 2 {
                *b == b':' || *b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        })
}

/// Junos media prefixes, written `ge-0/0/1`.
const JUNOS: [&str; 5] = ["ge", "xe", "et", "fe", "mge"];

/// Each media type's short token, and the words that name it.
const MEDIA: [(&str, &[&str]); 8] = [
    ("eth", &["ethernet", "eth", "et"]),
    ("gi", &["gigabitethernet", "gige", "gig", "gi"]),
    ("te", &["tengigabitethernet", "tengige", "ten", "te"]),
    (
        "twe",
        &["twentyfivegige", "twentyfivegigabitethernet", "twe"],
    ),
    ("fo", &["fortygigabitethernet", "fortygige", "fo"]),
    ("hu", &["hundredgigabitethernet", "hundredgige", "hu"]),
    ("fa", &["fastethernet", "fa"]),
    ("", &["port", "interface"]),
];

/// Leading zeros off every run of digits, the rest kept.
fn path(rest: &str) -> String {
    let mut out = String::with_capacity(rest.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if !digits.is_empty() {
            let trimmed = digits.trim_start_matches('0');
            out.push_str(if trimmed.is_empty() { "0" } else { trimmed });
            digits.clear();
        }
    };
    for c in rest.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::normalise_port;

    /// Every spelling in a group normalises to the group's form.
    fn check(form: &str, spellings: &[&str]) {
        for s in spellings {
            assert_eq!(normalise_port(s), form, "{s:?}");
        }
    }

    #[test]
    fn spellings_of_one_port_merge() {
        check(
            "eth1/1",
            &[
                "Ethernet1/1",
                "Eth1/1",
                "eth 1/01",
                "Et1/1",
                " ETHERNET1/1 ",
            ],
        );
        check("eth1", &["Ethernet1", "Et1", "ethernet 1"]);
        check("gi1/0/1", &["GigabitEthernet1/0/1", "Gi1/0/1", "gig1/0/1"]);
        check("te1/1", &["TenGigabitEthernet1/1", "Te1/1", "TenGigE1/1"]);
        check("hu1/0/1", &["HundredGigE1/0/1", "Hu1/0/1"]);
        check("twe1/0/1", &["TwentyFiveGigE1/0/1", "Twe1/0/1"]);
        check("fo1/1", &["FortyGigabitEthernet1/1", "Fo1/1"]);
        check("fa0/1", &["FastEthernet0/1", "Fa0/1"]);
        check("ge-0/0/1", &["ge-0/0/1", "GE-0/0/01"]);
        check("xe-0/0/1", &["xe-0/0/1"]);
        check("et-0/0/1", &["et-0/0/1"]);
        check("xe-0/0/1:2", &["xe-0/0/1:2"]);
        check("1/1/1", &["1/1/1", "1/1/01"]);
        check("swp1", &["swp1", "SWP01"]);
        check("swp1s0", &["swp1s0"]);
        check("1", &["port 1", "Port1", "1", "port-1"]);
        check("eth1/1.100", &["Ethernet1/1.100"]);
        // Found by the fuzzer: white space other than a space, and inside
        // the word, must not make a second pass differ.
        check("0/7", &["port\u{c}0/7", "por t0/7"]);
        check("eth1/1:1", &["Ethernet1/1:1"]);
        check("enp1s0", &["enp1s0"]);
    }

    #[test]
    fn different_ports_stay_apart() {
        let apart = [
            ("Gi1/0/1", "Te1/0/1"),
            ("ge-0/0/1", "xe-0/0/1"),
            ("et-0/0/1", "Et0/0/1"),
            ("Ethernet1/1", "1/1"),
            ("1/1", "1/1/1"),
            ("swp1", "Ethernet1"),
            ("Ethernet1/1", "Ethernet1/10"),
            ("eth0", "eth1"),
            ("Ethernet1/1.100", "Ethernet1/1"),
        ];
        for (a, b) in apart {
            assert_ne!(normalise_port(a), normalise_port(b), "{a} and {b}");
        }
    }

    #[test]
    fn parts_split_word_from_path() {
        for (name, word, path) in [
            ("Ethernet1/1", "eth", "1/1"),
            ("ge-0/0/1", "ge", "0/0/1"),
            ("GigabitEthernet1/0/1", "gi", "1/0/1"),
            ("Port 7", "", "7"),
            ("1/1/1", "", "1/1/1"),
            ("swp1s0", "swp", "1s0"),
            ("xe-0/0/1:2", "xe", "0/0/1:2"),
            ("uplink", "uplink", ""),
            ("52:54:00:AA:00:01", "52:54:00:aa:00:01", ""),
            ("", "", ""),
        ] {
            assert_eq!(
                super::port_parts(name),
                (word.to_owned(), path.to_owned()),
                "{name:?}"
            );
        }
    }

    #[test]
    fn other_text_is_only_lowered_and_trimmed() {
        assert_eq!(normalise_port("52:54:00:AA:00:01"), "52:54:00:aa:00:01");
        assert_eq!(normalise_port(""), "");
        assert_eq!(normalise_port("uplink"), "uplink");
        assert_eq!(normalise_port("Ethernet"), "ethernet");
    }
}
