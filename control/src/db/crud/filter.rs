//! The systems filter language, shared by the API (`?filter=`), the admin
//! pages and `mash --filter`: one string such as
//!
//! ```text
//! group:compute rack:r1 -phase:ready mac:52:54:00:* ip:10.0.0.0/24 bmc:10.1.*
//! ```
//!
//! The rules:
//!
//! - A filter is terms separated by white space; a system must match every
//!   term (AND). An empty filter matches every system.
//! - A term is `key:value`. `key:a,b` matches either value (OR); a leading
//!   `-` negates the term (`-phase:ready`: not ready, including never seen).
//! - A value is bare (no white space, comma or quote) or double-quoted, with
//!   `\"` and `\\` as its escapes (`rack:"row 1"`). `*` matches any run of
//!   characters (a glob); there is no way to match a literal `*`.
//! - Text is compared without case (values are lowercased when parsed).
//! - The keys: `hostname`, `group` and `image` (their slugs), `rack` (a
//!   system without a rack matches no value), `mac` (any NIC's, an address
//!   in any usual notation or a glob over the `52:54:00:12:34:56` form),
//!   `ip` (any NIC's IPv4 or IPv6 address: an address, an IPv4 prefix such
//!   as `10.0.0.0/24`, or a glob), `bmc` (the BMC's IPv4 address, as `ip`),
//!   and `phase`: a boot board state (`dhcp`, `ipxe`, `kernel`, `enrolled`,
//!   `image`, `scripts`, `ready`, `failed`), or `none` for a system never
//!   seen booting.
//!
//! [`Filter::parse`] gives a typed AST or a [`FilterError`] that names the
//! bad term and says what is allowed; [`Filter`]'s `Display` prints the
//! canonical text, which parses back to the same filter (the `systems_filter`
//! fuzz target holds it to that). [`Filter::push_condition`] compiles to SQL
//! with every value bound, in the one dialect SQLite, MariaDB and PostgreSQL
//! share: `LOWER(..) LIKE .. ESCAPE '!'` and `EXISTS` subqueries.
//!
//! Hand-written: the grammar is a dozen lines, and no crate parses this
//! search-box syntax into our typed values. An IPv4 prefix is matched on the
//! stored dotted text (the engines share no function that turns it into a
//! number): the octet the prefix splits becomes the few decimal `LIKE`
//! shapes that cover its range (`64`..`127` is `64` to `69`, `7_`, `8_`,
//! `9_`, `10_`, `11_` and `120` to `127`; see `octet_patterns`), so a `/26`
//! costs about twenty bound patterns, not 64.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use mprov_api::boot::BoardState;

use super::validate::parse_mac;
use crate::db::{Sql, Val};

/// The longest filter text accepted.
pub const MAX_FILTER_LEN: usize = 4096;
/// The most terms one filter has.
pub const MAX_TERMS: usize = 32;
/// The most values one filter has over all its terms (each costs one or,
/// for an IPv4 prefix, a few dozen bound values; [`crate::db::MAX_BINDS`]
/// bounds a statement).
pub const MAX_VALUES: usize = 32;
/// The longest single value.
pub const MAX_VALUE_LEN: usize = 255;

/// The keys, in the order messages list them.
pub const KEYS: [Key; 8] = [
    Key::Bmc,
    Key::Group,
    Key::Hostname,
    Key::Image,
    Key::Ip,
    Key::Mac,
    Key::Phase,
    Key::Rack,
];

/// What a term matches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// The BMC's IPv4 address.
    Bmc,
    /// A group's slug.
    Group,
    /// The host name.
    Hostname,
    /// The image's slug.
    Image,
    /// A NIC's IPv4 or IPv6 address.
    Ip,
    /// A NIC's MAC address.
    Mac,
    /// The boot board state.
    Phase,
    /// The rack.
    Rack,
}

impl Key {
    /// The key as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Key::Bmc => "bmc",
            Key::Group => "group",
            Key::Hostname => "hostname",
            Key::Image => "image",
            Key::Ip => "ip",
            Key::Mac => "mac",
            Key::Phase => "phase",
            Key::Rack => "rack",
        }
    }

    fn from_name(name: &str) -> Option<Key> {
        KEYS.into_iter().find(|k| k.as_str() == name)
    }
}

/// A parsed filter: terms that all must match.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filter {
    /// The terms, in the order written.
    pub terms: Vec<Term>,
}

/// One term: its values (any may match), maybe negated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// `-key:..`: the systems the term would not match.
    pub negated: bool,
    /// The key and its values.
    pub matcher: Matcher,
}

/// A key with its typed values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// `bmc:`
    Bmc(Vec<IpMatch>),
    /// `group:`
    Group(Vec<Glob>),
    /// `hostname:`
    Hostname(Vec<Glob>),
    /// `image:`
    Image(Vec<Glob>),
    /// `ip:`
    Ip(Vec<IpMatch>),
    /// `mac:`
    Mac(Vec<Glob>),
    /// `phase:`
    Phase(Vec<Phase>),
    /// `rack:`
    Rack(Vec<Glob>),
}

/// Lowercased text in which `*` matches any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    /// The text as parsed (lowercase, `*` for the wildcard).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `LIKE` pattern, `!` escaping `%`, `_` and itself.
    fn like(&self) -> String {
        let mut p = String::with_capacity(self.0.len());
        for ch in self.0.chars() {
            match ch {
                '*' => p.push('%'),
                '%' | '_' | '!' => {
                    p.push('!');
                    p.push(ch);
                }
                _ => p.push(ch),
            }
        }
        p
    }
}

/// An `ip:` or `bmc:` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpMatch {
    /// One address.
    Addr(IpAddr),
    /// An IPv4 prefix, host bits cleared.
    Cidr(Ipv4Addr, u8),
    /// A glob over the address text (`10.0.*`).
    Glob(Glob),
}

/// A `phase:` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `none`: never seen booting.
    Never,
    /// A board state.
    State(BoardState),
}

/// Why a filter did not parse: the term at fault and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.show())]
pub struct FilterError {
    /// The term at fault, as written (empty for the whole filter).
    pub term: String,
    /// What is wrong and what would be right.
    pub message: String,
}

impl FilterError {
    fn new(term: &str, message: impl Into<String>) -> FilterError {
        FilterError {
            term: term.to_owned(),
            message: message.into(),
        }
    }

    fn show(&self) -> String {
        if self.term.is_empty() {
            self.message.clone()
        } else {
            format!("in `{}`: {}", self.term, self.message)
        }
    }
}

fn key_list() -> String {
    KEYS.map(Key::as_str).join(", ")
}

fn phase_list() -> String {
    let mut names: Vec<&str> = BoardState::ALL.iter().map(|s| s.as_str()).collect();
    names.push("none");
    names.join(", ")
}

impl Filter {
    /// Parses a filter; see the module doc for the language.
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        if text.len() > MAX_FILTER_LEN {
            return Err(FilterError::new(
                "",
                format!(
                    "the filter is {} bytes long; at most {MAX_FILTER_LEN} are allowed",
                    text.len()
                ),
            ));
        }
        let mut terms = Vec::new();
        let mut values = 0;
        let mut rest = text;
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                break;
            }
            let (raw, after) = split_term(rest);
            rest = after;
            let term = parse_term(raw)?;
            values += term.matcher.len();
            terms.push(term);
            if terms.len() > MAX_TERMS {
                return Err(FilterError::new(
                    raw,
                    format!("a filter has at most {MAX_TERMS} terms"),
                ));
            }
            if values > MAX_VALUES {
                return Err(FilterError::new(
                    raw,
                    format!("a filter has at most {MAX_VALUES} values over all its terms"),
                ));
            }
        }
        Ok(Filter { terms })
    }

    /// Whether the filter has no term (and so matches every system).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Appends the condition a `systems` row must meet (`1 = 1` for an
    /// empty filter), for a statement whose `FROM` names the table
    /// `systems` unaliased. Every value is bound.
    pub fn push_condition(&self, out: &mut Sql) {
        if self.terms.is_empty() {
            out.push("1 = 1");
            return;
        }
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                out.push(" AND ");
            }
            if term.negated {
                out.push("NOT ");
            }
            out.push("(");
            term.matcher.push_condition(out);
            out.push(")");
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{term}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.negated {
            f.write_str("-")?;
        }
        write!(f, "{}:", self.matcher.key().as_str())?;
        let texts: Vec<String> = match &self.matcher {
            Matcher::Bmc(v) | Matcher::Ip(v) => v.iter().map(IpMatch::to_string).collect(),
            Matcher::Group(v)
            | Matcher::Hostname(v)
            | Matcher::Image(v)
            | Matcher::Mac(v)
            | Matcher::Rack(v) => v.iter().map(|g| g.0.clone()).collect(),
            Matcher::Phase(v) => v.iter().map(|p| p.as_str().to_owned()).collect(),
        };
        for (i, t) in texts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write_value(f, t)?;
        }
        Ok(())
    }
}

impl fmt::Display for IpMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpMatch::Addr(a) => write!(f, "{a}"),
            IpMatch::Cidr(net, len) => write!(f, "{net}/{len}"),
            IpMatch::Glob(g) => f.write_str(&g.0),
        }
    }
}

impl Phase {
    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Never => "none",
            Phase::State(s) => s.as_str(),
        }
    }
}

/// A value bare when it can be, else quoted with `\"` and `\\` escaped.
fn write_value(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    let bare = !text.is_empty()
        && !text
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, ',' | '"' | '\\'));
    if bare {
        return f.write_str(text);
    }
    f.write_str("\"")?;
    for c in text.chars() {
        if matches!(c, '"' | '\\') {
            f.write_str("\\")?;
        }
        write!(f, "{c}")?;
    }
    f.write_str("\"")
}

/// The first term of `s` (which starts with no white space) and the rest:
/// the term ends at white space outside quotes.
fn split_term(s: &str) -> (&str, &str) {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if !quoted && c.is_whitespace() {
            return (&s[..i], &s[i..]);
        }
    }
    (s, "")
}

fn parse_term(raw: &str) -> Result<Term, FilterError> {
    let (negated, body) = match raw.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, raw),
    };
    let Some((name, values)) = body.split_once(':') else {
        return Err(FilterError::new(
            raw,
            format!(
                "a term is key:value, such as group:compute; the keys are: {}",
                key_list()
            ),
        ));
    };
    let key = Key::from_name(&name.to_lowercase()).ok_or_else(|| {
        FilterError::new(
            raw,
            format!("unknown key {name:?}; the keys are: {}", key_list()),
        )
    })?;
    let texts = split_values(raw, values)?;
    let mut matcher = Matcher::empty(key);
    for text in &texts {
        // Counted lowercased, as stored and printed: lowercasing may
        // lengthen text, and the printed filter must parse again.
        if text.to_lowercase().chars().count() > MAX_VALUE_LEN {
            return Err(FilterError::new(
                raw,
                format!("a value is at most {MAX_VALUE_LEN} characters long"),
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(FilterError::new(raw, "a value has no control characters"));
        }
        matcher
            .push(text)
            .map_err(|message| FilterError::new(raw, message))?;
    }
    Ok(Term { negated, matcher })
}

/// The comma-separated values after `key:`, unquoted.
fn split_values(raw: &str, s: &str) -> Result<Vec<String>, FilterError> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next() {
                        Some(e @ ('"' | '\\')) => value.push(e),
                        _ => {
                            return Err(FilterError::new(
                                raw,
                                "inside quotes, a backslash escapes only \" and \\",
                            ));
                        }
                    },
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(FilterError::new(raw, "a quoted value has no closing \""));
            }
        } else {
            while let Some(&c) = chars.peek() {
                match c {
                    ',' => break,
                    '"' => {
                        return Err(FilterError::new(
                            raw,
                            "a quote may only open a value (key:\"a value\")",
                        ));
                    }
                    c => {
                        value.push(c);
                        chars.next();
                    }
                }
            }
        }
        if value.is_empty() {
            return Err(FilterError::new(
                raw,
                "a value is missing (key:value, or key:a,b for either)",
            ));
        }
        out.push(value);
        match chars.next() {
            None => return Ok(out),
            Some(',') => {}
            Some(_) => {
                return Err(FilterError::new(
                    raw,
                    "values are separated by commas; a closing quote ends a value",
                ));
            }
        }
    }
}

impl Matcher {
    fn empty(key: Key) -> Matcher {
        match key {
            Key::Bmc => Matcher::Bmc(Vec::new()),
            Key::Group => Matcher::Group(Vec::new()),
            Key::Hostname => Matcher::Hostname(Vec::new()),
            Key::Image => Matcher::Image(Vec::new()),
            Key::Ip => Matcher::Ip(Vec::new()),
            Key::Mac => Matcher::Mac(Vec::new()),
            Key::Phase => Matcher::Phase(Vec::new()),
            Key::Rack => Matcher::Rack(Vec::new()),
        }
    }

    /// The key.
    pub fn key(&self) -> Key {
        match self {
            Matcher::Bmc(_) => Key::Bmc,
            Matcher::Group(_) => Key::Group,
            Matcher::Hostname(_) => Key::Hostname,
            Matcher::Image(_) => Key::Image,
            Matcher::Ip(_) => Key::Ip,
            Matcher::Mac(_) => Key::Mac,
            Matcher::Phase(_) => Key::Phase,
            Matcher::Rack(_) => Key::Rack,
        }
    }

    fn len(&self) -> usize {
        match self {
            Matcher::Bmc(v) | Matcher::Ip(v) => v.len(),
            Matcher::Group(v)
            | Matcher::Hostname(v)
            | Matcher::Image(v)
            | Matcher::Mac(v)
            | Matcher::Rack(v) => v.len(),
            Matcher::Phase(v) => v.len(),
        }
    }

    /// Adds one value, typed for the key; the message says what is allowed.
    fn push(&mut self, text: &str) -> Result<(), String> {
        match self {
            Matcher::Bmc(v) => {
                let m = parse_ip(text)?;
                if matches!(m, IpMatch::Addr(IpAddr::V6(_))) {
                    return Err(format!(
                        "{text:?}: BMC addresses are IPv4 (an address, a prefix such as 10.1.0.0/16, or a glob such as 10.1.*)"
                    ));
                }
                v.push(m);
            }
            Matcher::Ip(v) => v.push(parse_ip(text)?),
            Matcher::Group(v) | Matcher::Hostname(v) | Matcher::Image(v) | Matcher::Rack(v) => {
                v.push(Glob(text.to_lowercase()));
            }
            Matcher::Mac(v) => v.push(parse_mac_glob(text)?),
            Matcher::Phase(v) => {
                let lower = text.to_lowercase();
                let phase = match lower.as_str() {
                    "none" => Phase::Never,
                    name => Phase::State(BoardState::from_wire(name).ok_or_else(|| {
                        format!("unknown phase {text:?}; the phases are: {}", phase_list())
                    })?),
                };
                v.push(phase);
            }
        }
        Ok(())
    }

    fn push_condition(&self, out: &mut Sql) {
        match self {
            Matcher::Hostname(v) => likes(out, "systems.hostname", v),
            Matcher::Rack(v) => {
                out.push("systems.rack IS NOT NULL AND (");
                likes(out, "systems.rack", v);
                out.push(")");
            }
            Matcher::Image(v) => {
                out.push(
                    "EXISTS (SELECT 1 FROM system_images fi WHERE fi.id = systems.image_id AND (",
                );
                likes(out, "fi.slug", v);
                out.push("))");
            }
            Matcher::Group(v) => {
                out.push(
                    "EXISTS (SELECT 1 FROM group_members fm JOIN system_groups fg ON fg.id = fm.group_id WHERE fm.system_id = systems.id AND (",
                );
                likes(out, "fg.slug", v);
                out.push("))");
            }
            Matcher::Mac(v) => {
                out.push(
                    "EXISTS (SELECT 1 FROM network_interfaces fnic WHERE fnic.system_id = systems.id AND (",
                );
                likes(out, "fnic.mac", v);
                out.push("))");
            }
            Matcher::Ip(v) => {
                out.push(
                    "EXISTS (SELECT 1 FROM network_interfaces fnic WHERE fnic.system_id = systems.id AND (",
                );
                ip_conditions(out, "fnic.ipv4", Some("fnic.ipv6"), v);
                out.push("))");
            }
            Matcher::Bmc(v) => {
                out.push("EXISTS (SELECT 1 FROM bmcs fb WHERE fb.system_id = systems.id AND (");
                ip_conditions(out, "fb.ipv4", None, v);
                out.push("))");
            }
            Matcher::Phase(v) => {
                let states: Vec<Val> = v
                    .iter()
                    .filter_map(|p| match p {
                        Phase::State(s) => Some(Val::Text(Some(s.as_str().to_owned()))),
                        Phase::Never => None,
                    })
                    .collect();
                let never = v.contains(&Phase::Never);
                if !states.is_empty() {
                    out.push("EXISTS (SELECT 1 FROM node_states fs WHERE fs.system_id = systems.id AND fs.state IN ");
                    out.bind_list(states);
                    out.push(")");
                    if never {
                        out.push(" OR ");
                    }
                }
                if never {
                    out.push(
                        "NOT EXISTS (SELECT 1 FROM node_states fs WHERE fs.system_id = systems.id)",
                    );
                }
            }
        }
    }
}

/// `LOWER(col) LIKE ? ESCAPE '!' OR ...` over the globs.
fn likes(out: &mut Sql, col: &str, globs: &[Glob]) {
    for (i, g) in globs.iter().enumerate() {
        if i > 0 {
            out.push(" OR ");
        }
        like(out, col, g.like());
    }
}

fn like(out: &mut Sql, col: &str, pattern: String) {
    out.push("LOWER(").push(col).push(") LIKE ");
    out.bind(Val::Text(Some(pattern))).push(" ESCAPE '!'");
}

/// The conditions of `ip:` or `bmc:` values on an IPv4 column and maybe an
/// IPv6 one, ORed.
fn ip_conditions(out: &mut Sql, v4: &str, v6: Option<&str>, values: &[IpMatch]) {
    let mut first = true;
    let mut or = |out: &mut Sql| {
        if !first {
            out.push(" OR ");
        }
        first = false;
    };
    for m in values {
        match m {
            IpMatch::Addr(IpAddr::V4(a)) => {
                or(out);
                out.push(v4)
                    .push(" = ")
                    .bind(Val::Text(Some(a.to_string())));
            }
            IpMatch::Addr(IpAddr::V6(a)) => {
                or(out);
                match v6 {
                    Some(col) => out
                        .push(col)
                        .push(" = ")
                        .bind(Val::Text(Some(a.to_string()))),
                    // The parser refuses this; matching nothing is the safe reading.
                    None => out.push("1 = 0"),
                };
            }
            IpMatch::Cidr(net, len) => {
                for p in cidr_patterns(*net, *len) {
                    or(out);
                    like(out, v4, p);
                }
            }
            IpMatch::Glob(g) => {
                or(out);
                like(out, v4, g.like());
                if let Some(col) = v6 {
                    out.push(" OR ");
                    like(out, col, g.like());
                }
            }
        }
    }
}

/// An `ip:` value: an address, an IPv4 prefix or a glob.
fn parse_ip(text: &str) -> Result<IpMatch, String> {
    let lower = text.to_lowercase();
    if let Some((net, len)) = lower.split_once('/') {
        let net: Ipv4Addr = net.parse().map_err(|_| {
            format!("{text:?}: a prefix is an IPv4 network and a length, such as 10.0.0.0/24")
        })?;
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("{text:?}: a prefix length is 0 to 32"))?;
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        return Ok(IpMatch::Cidr(Ipv4Addr::from(u32::from(net) & mask), len));
    }
    if lower.contains('*') {
        if lower
            .chars()
            .all(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '*'))
        {
            return Ok(IpMatch::Glob(Glob(lower)));
        }
        return Err(format!(
            "{text:?}: an address glob has only digits, dots, colons and *"
        ));
    }
    lower.parse().map(IpMatch::Addr).map_err(|_| {
        format!(
            "{text:?} is not an IP address, an IPv4 prefix such as 10.0.0.0/24, or a glob such as 10.0.*"
        )
    })
}

/// A `mac:` value: an address in any notation `parse_mac` takes (stored
/// normalised), or a glob over the normalised form.
fn parse_mac_glob(text: &str) -> Result<Glob, String> {
    if !text.contains('*') {
        return parse_mac(text).map(Glob);
    }
    let lower = text.to_lowercase();
    if lower
        .chars()
        .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '*'))
    {
        Ok(Glob(lower))
    } else {
        Err(format!(
            "{text:?}: a MAC glob has only hex digits, colons and *, such as 52:54:00:*"
        ))
    }
}

/// The `LIKE` patterns of the dotted IPv4 texts in `net/len`: the octets
/// the prefix fixes, then the decimal shapes of the octet it splits, then
/// anything.
pub(crate) fn cidr_patterns(net: Ipv4Addr, len: u8) -> Vec<String> {
    let octets = net.octets();
    let fixed = usize::from(len / 8).min(4);
    let mut prefix = String::new();
    for o in &octets[..fixed] {
        prefix.push_str(&o.to_string());
        prefix.push('.');
    }
    if fixed == 4 {
        // A /32: the address itself (the trailing dot dropped).
        prefix.pop();
        return vec![prefix];
    }
    let rem = len % 8;
    if rem == 0 {
        return vec![format!("{prefix}%")];
    }
    let lo = octets[fixed];
    let hi = lo | (u8::MAX >> rem);
    let tail = if fixed < 3 { ".%" } else { "" };
    octet_patterns(lo, hi)
        .into_iter()
        .map(|p| format!("{prefix}{p}{tail}"))
        .collect()
}

/// `LIKE` shapes (digits, then `_` for any digit) that together match the
/// decimal texts of `lo..=hi` and no other octet: the numbers written out,
/// then any ten that differ only in one digit merged into a `_`, again
/// until none merge (`100`..`199` becomes `1__`).
pub(crate) fn octet_patterns(lo: u8, hi: u8) -> Vec<String> {
    let mut pats: Vec<String> = (lo..=hi).map(|n| n.to_string()).collect();
    loop {
        let mut merged = Vec::with_capacity(pats.len());
        let mut i = 0;
        while i < pats.len() {
            match full_ten(&pats[i..]) {
                Some(p) => {
                    merged.push(p);
                    i += 10;
                }
                None => {
                    merged.push(pats[i].clone());
                    i += 1;
                }
            }
        }
        if merged.len() == pats.len() {
            return pats;
        }
        pats = merged;
    }
}

/// The merged shape when `rest` starts with the ten shapes `x0_..`, `x1_..`
/// .. `x9_..`.
fn full_ten(rest: &[String]) -> Option<String> {
    let first = rest.first()?;
    let wild = first.bytes().rev().take_while(|b| *b == b'_').count();
    let pos = first.len().checked_sub(wild + 1)?;
    if rest.len() < 10 || first.as_bytes().get(pos) != Some(&b'0') {
        return None;
    }
    let head = &first[..pos];
    let stars = "_".repeat(wild);
    for (d, p) in rest.iter().take(10).enumerate() {
        if *p != format!("{head}{d}{stars}") {
            return None;
        }
    }
    Some(format!("{head}_{stars}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Engine;

    fn ok(text: &str) -> Filter {
        Filter::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn err(text: &str) -> String {
        match Filter::parse(text) {
            Ok(f) => panic!("{text:?} parsed to {f:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn glob(s: &str) -> Glob {
        Glob(s.to_owned())
    }

    #[test]
    fn parses_the_example() {
        let f = ok("group:compute rack:r1 -phase:ready mac:52:54:00:* ip:10.0.0.0/24 bmc:10.1.*");
        assert_eq!(
            f.terms,
            vec![
                Term {
                    negated: false,
                    matcher: Matcher::Group(vec![glob("compute")])
                },
                Term {
                    negated: false,
                    matcher: Matcher::Rack(vec![glob("r1")])
                },
                Term {
                    negated: true,
                    matcher: Matcher::Phase(vec![Phase::State(BoardState::Ready)])
                },
                Term {
                    negated: false,
                    matcher: Matcher::Mac(vec![glob("52:54:00:*")])
                },
                Term {
                    negated: false,
                    matcher: Matcher::Ip(vec![IpMatch::Cidr(Ipv4Addr::new(10, 0, 0, 0), 24)])
                },
                Term {
                    negated: false,
                    matcher: Matcher::Bmc(vec![IpMatch::Glob(glob("10.1.*"))])
                },
            ]
        );
    }

    #[test]
    fn values_are_normalised() {
        let check = |text: &str, printed: &str| assert_eq!(ok(text).to_string(), printed, "{text}");
        check("", "");
        check("  \t ", "");
        check("Group:Compute", "group:compute");
        check("mac:52-54-00-AB-CD-EF", "mac:52:54:00:ab:cd:ef");
        check("mac:5254.00ab.cdef", "mac:52:54:00:ab:cd:ef");
        check("ip:10.0.0.77/24", "ip:10.0.0.0/24");
        check("ip:2001:DB8::1", "ip:2001:db8::1");
        check("phase:READY,none", "phase:ready,none");
        check("rack:\"Row 1\"", "rack:\"row 1\"");
        check("rack:\"a\\\"b\"", "rack:\"a\\\"b\"");
        check("rack:\"\\\\\"", "rack:\"\\\\\"");
        check(
            "hostname:n*,\"x,y\"   -image:base",
            "hostname:n*,\"x,y\" -image:base",
        );
    }

    #[test]
    fn errors_name_the_term_and_what_is_allowed() {
        let check = |text: &str, needles: &[&str]| {
            let msg = err(text);
            for n in needles {
                assert!(msg.contains(n), "{text:?}: {msg:?} lacks {n:?}");
            }
        };
        check(
            "group:a colour:red",
            &[
                "`colour:red`",
                "unknown key \"colour\"",
                "bmc, group, hostname",
            ],
        );
        check("compute", &["`compute`", "key:value", "rack"]);
        check("group:", &["`group:`", "value is missing"]);
        check("group:a,,b", &["value is missing"]);
        check("phase:booting", &["unknown phase", "dhcp", "ready", "none"]);
        check("phase:read*", &["unknown phase"]);
        check("ip:10.0.0.0/33", &["`ip:10.0.0.0/33`", "0 to 32"]);
        check("ip:fe80::/64", &["IPv4 network"]);
        check("ip:10.0.0.300", &["not an IP address"]);
        check("ip:10.0.x.*", &["glob"]);
        check("bmc:2001:db8::1", &["BMC addresses are IPv4"]);
        check("mac:52:54:00", &["not a MAC address"]);
        check("mac:zz:*", &["MAC glob"]);
        check("rack:\"open", &["no closing"]);
        check("rack:a\"b\"", &["quote may only open"]);
        check("rack:\"a\"b", &["separated by commas"]);
        check("rack:\"a\\n\"", &["backslash"]);
        check("rack:a\u{7}", &["control"]);
    }

    #[test]
    fn limits_are_errors() {
        let many: Vec<String> = (0..=MAX_TERMS).map(|i| format!("rack:r{i}")).collect();
        assert!(err(&many.join(" ")).contains("terms"));
        let values: Vec<String> = (0..=MAX_VALUES).map(|i| format!("r{i}")).collect();
        assert!(err(&format!("rack:{}", values.join(","))).contains("values"));
        assert!(err(&"x".repeat(MAX_FILTER_LEN + 1)).contains("bytes long"));
        assert!(err(&format!("rack:{}", "x".repeat(MAX_VALUE_LEN + 1))).contains("characters"));
    }

    /// Whether `text` matches a `LIKE` pattern whose only wildcards are `_`
    /// and `%` (no escapes: address patterns have none).
    fn like_matches(pattern: &str, text: &str) -> bool {
        match pattern.chars().next() {
            None => text.is_empty(),
            Some('%') => (0..=text.len()).any(|i| like_matches(&pattern[1..], &text[i..])),
            Some('_') => !text.is_empty() && like_matches(&pattern[1..], &text[1..]),
            Some(c) => text.starts_with(c) && like_matches(&pattern[1..], &text[1..]),
        }
    }

    /// The octet shapes of every aligned block match exactly its numbers.
    #[test]
    fn octet_patterns_cover_exactly_their_range() {
        for rem in 1..=7u8 {
            let size = 1u16 << (8 - rem);
            for start in (0..256u16).step_by(usize::from(size)) {
                let (lo, hi) = (start as u8, (start + size - 1) as u8);
                let pats = octet_patterns(lo, hi);
                assert!(pats.len() <= 30, "{lo}-{hi}: {pats:?}");
                for n in 0..=255u8 {
                    let hit = pats.iter().any(|p| like_matches(p, &n.to_string()));
                    assert_eq!(hit, (lo..=hi).contains(&n), "{n} in {lo}-{hi}: {pats:?}");
                }
            }
        }
        assert_eq!(octet_patterns(100, 199), vec!["1__"]);
        assert_eq!(octet_patterns(0, 9), vec!["_"]);
    }

    #[test]
    fn cidr_patterns_match_their_addresses() {
        let cases = [
            ("10.0.0.0", 24, "10.0.0.17", true),
            ("10.0.0.0", 24, "10.0.1.17", false),
            ("10.0.0.64", 26, "10.0.0.127", true),
            ("10.0.0.64", 26, "10.0.0.128", false),
            ("10.0.0.64", 26, "10.0.0.6", false),
            ("10.0.0.64", 26, "10.0.0.64", true),
            ("172.16.0.0", 12, "172.31.255.1", true),
            ("172.16.0.0", 12, "172.32.0.1", false),
            ("172.16.0.0", 12, "172.1.0.1", false),
            ("0.0.0.0", 0, "192.0.2.1", true),
            ("192.0.2.1", 32, "192.0.2.1", true),
            ("192.0.2.1", 32, "192.0.2.10", false),
            ("10.0.0.0", 8, "10.200.3.4", true),
            ("10.0.0.0", 8, "100.0.0.1", false),
        ];
        for (net, len, addr, want) in cases {
            let pats = cidr_patterns(net.parse().unwrap(), len);
            let hit = pats.iter().any(|p| like_matches(p, addr));
            assert_eq!(hit, want, "{addr} in {net}/{len}: {pats:?}");
        }
    }

    #[test]
    fn sql_binds_every_value() {
        let f = ok("-group:\"x'; DROP TABLE systems; --\" rack:a%b_c! phase:ready,none");
        let mut sql = Sql::new(Engine::Postgres);
        f.push_condition(&mut sql);
        let text = sql.text();
        assert!(!text.contains("DROP"), "{text}");
        assert!(text.starts_with("NOT ("), "{text}");
        assert!(text.contains("$3"), "{text}");
        let g = ok("rack:a%b_c!").terms[0].matcher.clone();
        let Matcher::Rack(v) = g else { panic!() };
        assert_eq!(v[0].like(), "a!%b!_c!!");
    }
}
