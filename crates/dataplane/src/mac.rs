//! Learned station addresses, keyed by (VLAN, address), and where each was last seen: the
//! switch's table (a port), and a VXLAN port's (the remote a frame came from, VLAN 0). Open
//! addressing over a fixed
//! power-of-two table, probed at most [`MacTable::PROBE`] slots; a full probe run replaces its
//! oldest entry. No allocation after construction; aging is checked on lookup (an aged entry
//! is a miss, and its slot is reused). The same address in two VLANs is two stations (802.1Q
//! independent learning); VLAN 0 is the untagged segment of ports with no VLAN settings.

use crate::pkt::PortId;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// VLAN << 48 | 48-bit address, + 1 (0: empty slot).
    key: u64,
    port: PortId,
    seen: Instant,
}

/// Learned station addresses (module docs).
#[derive(Debug)]
pub struct MacTable {
    slots: Box<[Option<Entry>]>,
    aging: Duration,
}

/// One learned address (for `pvnet ctl macs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacEntry {
    /// Its VLAN (0: ports with no VLAN settings).
    pub vlan: u16,
    /// The station address.
    pub mac: [u8; 6],
    /// Where it was last seen.
    pub port: PortId,
    /// Since when it has not sent.
    pub age: Duration,
}

#[inline]
fn mac_key(vlan: u16, m: [u8; 6]) -> u64 {
    let mut k = [0u8; 8];
    k[..6].copy_from_slice(&m);
    k[6..].copy_from_slice(&vlan.to_le_bytes());
    u64::from_le_bytes(k) + 1
}

/// The VLAN and address of a key.
fn key_parts(key: u64) -> (u16, [u8; 6]) {
    let b = (key - 1).to_le_bytes();
    (
        u16::from_le_bytes([b[6], b[7]]),
        [b[0], b[1], b[2], b[3], b[4], b[5]],
    )
}

/// Group bit: broadcast and multicast.
#[inline]
pub(crate) fn is_group(m: &[u8]) -> bool {
    m[0] & 1 != 0
}

impl MacTable {
    /// Slots probed per address.
    pub const PROBE: usize = 8;

    /// A table of `slots` entries (rounded up to a power of two, at least 16).
    pub(crate) fn new(slots: usize, aging: Duration) -> Self {
        let n = slots.max(16).next_power_of_two();
        Self {
            slots: vec![None; n].into_boxed_slice(),
            aging,
        }
    }

    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: the top bits of key * 2^64/phi.
        let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let bits = self.slots.len().trailing_zeros();
        usize::try_from(h >> (64 - bits)).unwrap_or(0)
    }

    /// Records that `mac` was seen in `vlan` on `port`. A group address is never learned.
    pub(crate) fn learn(&mut self, vlan: u16, mac: [u8; 6], port: PortId, now: Instant) {
        if is_group(&mac) {
            return;
        }
        let key = mac_key(vlan, mac);
        let mask = self.slots.len() - 1;
        let home = self.home(key);
        let mut hole = None;
        let mut oldest = (home, None::<Instant>);
        for i in 0..Self::PROBE {
            let at = (home + i) & mask;
            match &mut self.slots[at] {
                Some(e) if e.key == key => {
                    e.port = port;
                    e.seen = now;
                    return;
                }
                Some(e) => {
                    if oldest.1.is_none_or(|o| e.seen < o) {
                        oldest = (at, Some(e.seen));
                    }
                }
                None => {
                    hole.get_or_insert(at);
                }
            }
        }
        self.slots[hole.unwrap_or(oldest.0)] = Some(Entry {
            key,
            port,
            seen: now,
        });
    }

    /// The port `mac` was last seen on in `vlan`, unless it is a group address, unknown, or
    /// aged out.
    #[inline]
    pub(crate) fn lookup(&self, vlan: u16, mac: [u8; 6], now: Instant) -> Option<PortId> {
        if is_group(&mac) {
            return None;
        }
        let key = mac_key(vlan, mac);
        let mask = self.slots.len() - 1;
        let home = self.home(key);
        (0..Self::PROBE)
            .filter_map(|i| self.slots[(home + i) & mask])
            .find(|e| e.key == key)
            .filter(|e| now.saturating_duration_since(e.seen) < self.aging)
            .map(|e| e.port)
    }

    /// Forgets every address learned on `port` (it went down).
    pub(crate) fn flush_port(&mut self, port: PortId) {
        for s in self.slots.iter_mut() {
            if s.is_some_and(|e| e.port == port) {
                *s = None;
            }
        }
    }

    /// Forgets every address learned on `port` in a VLAN for which `keep` is false (the
    /// port's VLAN settings changed: it no longer carries them).
    pub(crate) fn flush_port_vlans(&mut self, port: PortId, keep: impl Fn(u16) -> bool) {
        for s in self.slots.iter_mut() {
            if s.is_some_and(|e| e.port == port && !keep(key_parts(e.key).0)) {
                *s = None;
            }
        }
    }

    /// Forgets every address learned in a VLAN for which `keep` is false, on any port (no
    /// port carries it any more). One pass over the table.
    pub(crate) fn flush_vlans(&mut self, keep: impl Fn(u16) -> bool) {
        for s in self.slots.iter_mut() {
            if s.is_some_and(|e| !keep(key_parts(e.key).0)) {
                *s = None;
            }
        }
    }

    /// Every live entry.
    pub(crate) fn entries(&self, now: Instant) -> Vec<MacEntry> {
        let mut v: Vec<MacEntry> = self
            .slots
            .iter()
            .flatten()
            .filter(|e| now.saturating_duration_since(e.seen) < self.aging)
            .map(|e| {
                let (vlan, mac) = key_parts(e.key);
                MacEntry {
                    vlan,
                    mac,
                    port: e.port,
                    age: now.saturating_duration_since(e.seen),
                }
            })
            .collect();
        v.sort_by_key(|e| (e.port, e.vlan, e.mac));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_looks_up_ages_and_flushes() {
        let t0 = Instant::now();
        let mut m = MacTable::new(16, Duration::from_secs(10));
        let a = [2, 0, 0, 0, 0, 1];
        let b = [2, 0, 0, 0, 0, 2];
        assert_eq!(m.lookup(0, a, t0), None);
        m.learn(0, a, 3, t0);
        m.learn(0, b, 4, t0);
        assert_eq!(m.lookup(0, a, t0), Some(3));
        assert_eq!(m.lookup(0, b, t0), Some(4));
        // moves
        m.learn(0, a, 5, t0 + Duration::from_secs(1));
        assert_eq!(m.lookup(0, a, t0 + Duration::from_secs(2)), Some(5));
        // ages
        assert_eq!(m.lookup(0, b, t0 + Duration::from_secs(11)), None);
        // group addresses are neither learned nor looked up
        m.learn(0, [0xff; 6], 1, t0);
        assert_eq!(m.lookup(0, [0xff; 6], t0), None);
        m.flush_port(5);
        assert_eq!(m.lookup(0, a, t0 + Duration::from_secs(2)), None);
        assert_eq!(m.entries(t0).len(), 1);
    }

    #[test]
    fn full_table_replaces_oldest() {
        let t0 = Instant::now();
        let mut m = MacTable::new(16, Duration::from_secs(1000));
        for i in 0..200u8 {
            m.learn(
                0,
                [2, 0, 0, 0, 1, i],
                u32::from(i),
                t0 + Duration::from_millis(u64::from(i)),
            );
        }
        // The newest is always found; the table never holds more than its slots.
        assert_eq!(
            m.lookup(0, [2, 0, 0, 0, 1, 199], t0 + Duration::from_secs(1)),
            Some(199)
        );
        assert!(m.entries(t0 + Duration::from_secs(1)).len() <= 16);
    }

    /// One address in two VLANs is two entries: learned, looked up, aged and flushed apart;
    /// the table lists each with its VLAN.
    #[test]
    fn one_address_in_two_vlans_is_two_stations() {
        let t0 = Instant::now();
        let mut m = MacTable::new(64, Duration::from_secs(10));
        let a = [2, 0, 0, 0, 0, 1];
        m.learn(10, a, 1, t0);
        assert_eq!(m.lookup(10, a, t0), Some(1));
        assert_eq!(m.lookup(20, a, t0), None, "not learned in VLAN 20");
        assert_eq!(m.lookup(0, a, t0), None, "nor untagged");
        m.learn(20, a, 2, t0 + Duration::from_secs(5));
        assert_eq!(m.lookup(10, a, t0), Some(1), "VLAN 10's entry did not move");
        assert_eq!(m.lookup(20, a, t0), Some(2));
        // Aging is per entry: VLAN 10's goes first.
        let t11 = t0 + Duration::from_secs(11);
        assert_eq!(m.lookup(10, a, t11), None);
        assert_eq!(m.lookup(20, a, t11), Some(2));
        let e = m.entries(t0 + Duration::from_secs(5));
        assert_eq!(
            e.iter().map(|e| (e.vlan, e.port)).collect::<Vec<_>>(),
            vec![(10, 1), (20, 2)]
        );
        assert_eq!(e[0].mac, a);
        // Flush one VLAN: the other stays.
        m.flush_vlans(|v| v != 20);
        assert_eq!(m.lookup(20, a, t0), None);
        assert_eq!(m.lookup(10, a, t0), Some(1));
        // Flush a port's VLANs it no longer carries.
        m.learn(30, a, 1, t0);
        m.flush_port_vlans(1, |v| v == 30);
        assert_eq!(m.lookup(10, a, t0), None);
        assert_eq!(m.lookup(30, a, t0), Some(1));
        // The highest VLAN round-trips through the key.
        m.learn(4094, [2, 0xff, 0xff, 0xff, 0xff, 0xff], 7, t0);
        assert!(m
            .entries(t0)
            .iter()
            .any(|e| e.vlan == 4094 && e.mac == [2, 0xff, 0xff, 0xff, 0xff, 0xff]));
    }
}
