//! The in-memory lease table: who holds which address, now.
//!
//! The table is the single authority for "is this address free", and it is
//! changed under one lock while a packet is handled, *before* the lease record
//! is committed to disk. So two concurrent clients can never both be given
//! one address, and if a commit fails the address merely stays taken until
//! its lease would have ended (the safe direction).

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use crate::inventory::Mac;
use crate::store::{LeaseKind, LeaseRecord};

/// The state of an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// ACKed (and logged).
    Bound,
    /// A client said it is in use by someone else (DHCPDECLINE); quarantined.
    Declined,
    /// OFFERed and held for the client for a short while.
    Offered,
}

/// One address's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The holder.
    pub mac: Mac,
    /// Until when, Unix seconds.
    pub until: u64,
    /// How it is held.
    pub state: State,
}

/// Addresses and their holders.
#[derive(Debug, Default)]
pub struct LeaseTable {
    by_ip: HashMap<Ipv4Addr, Binding>,
    by_mac: HashMap<Mac, Ipv4Addr>,
    cursor: u32,
    /// Entries in state `Bound` (expired ones included until reused), kept
    /// as a count so the leases gauge costs nothing per packet.
    bound_entries: usize,
    /// Pools found without a free address, until one is free again.
    exhausted: HashSet<(Ipv4Addr, Ipv4Addr)>,
}

/// What [`LeaseTable::allocate`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// A free address.
    Free(Ipv4Addr),
    /// No free address: the one held longest by an unconfirmed OFFER, to be
    /// offered anew.
    Reclaimed(Ipv4Addr),
    /// Every address is bound, quarantined or reserved.
    None,
}

impl LeaseTable {
    /// A table seeded from replayed lease records.
    pub fn from_records(records: &[LeaseRecord]) -> Self {
        let mut t = Self::default();
        for r in records.iter().filter(|r| r.kind == LeaseKind::Bound) {
            t.set(r.ip, r.mac, r.expires, State::Bound);
        }
        t
    }

    /// The address `mac` holds or was offered, and how.
    pub fn of_mac(&self, mac: &Mac) -> Option<(Ipv4Addr, Binding)> {
        let ip = *self.by_mac.get(mac)?;
        Some((ip, *self.by_ip.get(&ip)?))
    }

    /// The binding of `ip`, if any.
    pub fn binding(&self, ip: Ipv4Addr) -> Option<Binding> {
        self.by_ip.get(&ip).copied()
    }

    /// Whether `mac` may take `ip`: nobody else holds it unexpired, and it is
    /// not quarantined.
    pub fn free_for(&self, ip: Ipv4Addr, mac: &Mac, now: u64) -> bool {
        match self.by_ip.get(&ip) {
            None => true,
            Some(b) if b.until <= now => true,
            Some(b) => b.mac == *mac && b.state != State::Declined,
        }
    }

    /// Gives `ip` to `mac` until `until`; `mac` loses any other address.
    pub fn set(&mut self, ip: Ipv4Addr, mac: Mac, until: u64, state: State) {
        if let Some(old) = self.by_ip.get(&ip)
            && old.mac != mac
            && self.by_mac.get(&old.mac) == Some(&ip)
        {
            self.by_mac.remove(&old.mac);
        }
        if let Some(old_ip) = self.by_mac.insert(mac, ip)
            && old_ip != ip
            && self.by_ip.get(&old_ip).is_some_and(|b| b.mac == mac)
        {
            self.remove_ip(old_ip);
        }
        self.remove_ip(ip);
        if state == State::Bound {
            self.bound_entries += 1;
        }
        self.by_ip.insert(ip, Binding { mac, until, state });
    }

    fn remove_ip(&mut self, ip: Ipv4Addr) {
        if let Some(old) = self.by_ip.remove(&ip)
            && old.state == State::Bound
        {
            self.bound_entries -= 1;
        }
    }

    /// Entries bound (expired ones included until reused): the leases gauge.
    pub fn bound_entries(&self) -> usize {
        self.bound_entries
    }

    /// Holds `ip` for `mac` after an OFFER, unless it already holds it longer
    /// (an OFFER must not shorten a bound lease).
    pub fn offer(&mut self, ip: Ipv4Addr, mac: Mac, until: u64) {
        match self.by_ip.get(&ip) {
            Some(b) if b.mac == mac && b.state == State::Bound && b.until >= until => {}
            _ => self.set(ip, mac, until, State::Offered),
        }
    }

    /// Frees `ip` if `mac` holds it; returns whether it did.
    pub fn release(&mut self, ip: Ipv4Addr, mac: &Mac) -> bool {
        if self.by_ip.get(&ip).is_some_and(|b| b.mac == *mac) {
            self.remove_ip(ip);
            self.by_mac.remove(mac);
            true
        } else {
            false
        }
    }

    /// An address in `first..=last` for `mac`, skipping those `taken` says
    /// are reserved: a free one if any, scanning from a moving cursor (so a
    /// busy pool is not rescanned from its start for every client); else the
    /// oldest address held by an unconfirmed OFFER, so that clients which
    /// never REQUEST cannot starve the pool for the length of the offer
    /// hold. A bound lease or a quarantined address is never taken.
    pub fn allocate(
        &mut self,
        (first, last): (Ipv4Addr, Ipv4Addr),
        mac: &Mac,
        now: u64,
        taken: impl Fn(Ipv4Addr) -> bool,
    ) -> Pick {
        let (a, b) = (u32::from(first), u32::from(last));
        if a > b {
            return Pick::None;
        }
        let size = u64::from(b - a) + 1;
        let mut oldest: Option<(u64, Ipv4Addr)> = None;
        for i in 0..size {
            let off = (u64::from(self.cursor) + i) % size;
            // `off < size <= 2^32`, and `a + off <= b`, so neither overflows.
            let ip = Ipv4Addr::from(a + off as u32);
            if taken(ip) {
                continue;
            }
            if self.free_for(ip, mac, now) {
                self.cursor = ((off + 1) % size) as u32;
                return Pick::Free(ip);
            }
            if let Some(held) = self.by_ip.get(&ip)
                && held.state == State::Offered
                && oldest.is_none_or(|(until, _)| held.until < until)
            {
                oldest = Some((held.until, ip));
            }
        }
        match oldest {
            Some((_, ip)) => Pick::Reclaimed(ip),
            None => Pick::None,
        }
    }

    /// Counts the addresses of `first..=last` by how they are held now:
    /// (bound, offered, other: quarantined, reserved or free).
    pub fn census(&self, (first, last): (Ipv4Addr, Ipv4Addr), now: u64) -> (u64, u64, u64) {
        let (a, b) = (u32::from(first), u32::from(last));
        let (mut bound, mut offered, mut other) = (0, 0, 0);
        for n in a..=b {
            match self.by_ip.get(&Ipv4Addr::from(n)) {
                Some(h) if h.until > now && h.state == State::Bound => bound += 1,
                Some(h) if h.until > now && h.state == State::Offered => offered += 1,
                _ => other += 1,
            }
        }
        (bound, offered, other)
    }

    /// Marks the pool `first..=last` exhausted; true if it was not already
    /// (the start of an episode, which is warned about once).
    pub fn mark_exhausted(&mut self, pool: (Ipv4Addr, Ipv4Addr)) -> bool {
        self.exhausted.insert(pool)
    }

    /// Marks the pool as having free addresses again; true if this ends an
    /// episode.
    pub fn mark_available(&mut self, pool: (Ipv4Addr, Ipv4Addr)) -> bool {
        self.exhausted.remove(&pool)
    }

    /// Every unexpired bound lease: address, holder and end.
    pub fn bound_leases(&self, now: u64) -> impl Iterator<Item = (Ipv4Addr, Binding)> + '_ {
        self.by_ip
            .iter()
            .filter(move |(_, b)| b.state == State::Bound && b.until > now)
            .map(|(ip, b)| (*ip, *b))
    }

    /// Unexpired bound leases.
    pub fn bound(&self, now: u64) -> usize {
        self.by_ip
            .values()
            .filter(|b| b.state == State::Bound && b.until > now)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Mac = [2, 0, 0, 0, 0, 1];
    const B: Mac = [2, 0, 0, 0, 0, 2];

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, last)
    }

    #[test]
    fn allocate_skips_taken_and_reserved_and_reuses_expired() {
        let mut t = LeaseTable::default();
        t.set(ip(10), A, 100, State::Bound);
        let got = t.allocate((ip(10), ip(12)), &B, 50, |i| i == ip(11));
        assert_eq!(got, Pick::Free(ip(12)));
        t.set(ip(12), B, 100, State::Bound);
        assert_eq!(
            t.allocate((ip(10), ip(12)), &[9; 6], 50, |i| i == ip(11)),
            Pick::None
        );
        // After A's lease ends, .10 is free again.
        assert_eq!(
            t.allocate((ip(10), ip(12)), &[9; 6], 100, |i| i == ip(11)),
            Pick::Free(ip(10))
        );
    }

    #[test]
    fn a_mac_holds_one_address() {
        let mut t = LeaseTable::default();
        t.set(ip(10), A, 100, State::Offered);
        t.set(ip(11), A, 100, State::Bound);
        assert_eq!(t.binding(ip(10)), None);
        assert_eq!(t.of_mac(&A).map(|(i, _)| i), Some(ip(11)));
        // B takes .11 after expiry: A no longer maps to it.
        t.set(ip(11), B, 300, State::Bound);
        assert_eq!(t.of_mac(&A), None);
        assert!(!t.release(ip(11), &A));
        assert_eq!(t.bound_entries(), 1);
        assert!(t.release(ip(11), &B));
        assert_eq!(t.bound(0), 0);
        assert_eq!(t.bound_entries(), 0);
    }

    #[test]
    fn declined_is_not_free_even_for_its_client() {
        let mut t = LeaseTable::default();
        t.set(ip(10), A, 100, State::Declined);
        assert!(!t.free_for(ip(10), &A, 50));
        assert!(t.free_for(ip(10), &A, 100));
    }

    #[test]
    fn a_full_pool_reclaims_the_oldest_offer_never_a_lease() {
        let mut t = LeaseTable::default();
        let pool = (ip(10), ip(13));
        t.set(ip(10), A, 500, State::Bound);
        t.set(ip(11), B, 130, State::Offered);
        t.set(ip(12), [3; 6], 120, State::Offered);
        t.set(ip(13), [4; 6], 500, State::Declined);
        let c = [5; 6];
        assert_eq!(
            t.allocate(pool, &c, 100, |_| false),
            Pick::Reclaimed(ip(12))
        );
        t.offer(ip(12), c, 150);
        // .11 is now the oldest offer; the reserved one is skipped.
        assert_eq!(
            t.allocate(pool, &[6; 6], 100, |_| false),
            Pick::Reclaimed(ip(11))
        );
        assert_eq!(
            t.allocate(pool, &[6; 6], 100, |i| i == ip(11)),
            Pick::Reclaimed(ip(12))
        );
        assert_eq!(t.census(pool, 100), (1, 2, 1));
        // Bound and quarantined only: nothing to give.
        t.set(ip(11), B, 500, State::Bound);
        t.set(ip(12), c, 500, State::Bound);
        assert_eq!(t.allocate(pool, &[6; 6], 100, |_| false), Pick::None);
        assert!(t.mark_exhausted(pool));
        assert!(!t.mark_exhausted(pool));
        assert!(t.mark_available(pool));
        assert!(!t.mark_available(pool));
    }
}
