//! The VXLAN port's forwarding database: which tunnel endpoint (remote) each inner source
//! address was last seen behind, learned from decapsulated frames, aged as the switch's own
//! address table is. Open addressing over a fixed power-of-two table, at most [`PROBE`] slots
//! probed, a full run replacing its oldest entry: no allocation after construction.

use std::time::{Duration, Instant};

/// Slots probed per address.
const PROBE: usize = 8;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// 48-bit address + 1 (0: an empty slot).
    key: u64,
    /// Index of the remote in the port's list.
    remote: u16,
    seen: Instant,
}

/// Inner address -> remote (module docs).
#[derive(Debug)]
pub(crate) struct Fdb {
    slots: Box<[Option<Entry>]>,
    aging: Duration,
}

fn key(m: [u8; 6]) -> u64 {
    let mut k = [0u8; 8];
    k[..6].copy_from_slice(&m);
    u64::from_le_bytes(k) + 1
}

/// Group bit: broadcast and multicast.
#[inline]
pub(crate) fn is_group(m: &[u8; 6]) -> bool {
    m[0] & 1 != 0
}

impl Fdb {
    /// A table of `slots` entries (a power of two, at least 16).
    pub(crate) fn new(slots: usize, aging: Duration) -> Self {
        let n = slots.max(16).next_power_of_two();
        Self {
            slots: vec![None; n].into_boxed_slice(),
            aging,
        }
    }

    fn home(&self, key: u64) -> usize {
        let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let bits = self.slots.len().trailing_zeros();
        usize::try_from(h >> (64 - bits)).unwrap_or(0)
    }

    /// Records that `mac` sent from behind remote `remote`. Group addresses are never learned.
    #[inline]
    pub(crate) fn learn(&mut self, mac: [u8; 6], remote: u16, now: Instant) {
        if is_group(&mac) {
            return;
        }
        let key = key(mac);
        let mask = self.slots.len() - 1;
        let home = self.home(key);
        let mut hole = None;
        let mut oldest = (home, None::<Instant>);
        for i in 0..PROBE {
            let at = (home + i) & mask;
            match &mut self.slots[at] {
                Some(e) if e.key == key => {
                    e.remote = remote;
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
            remote,
            seen: now,
        });
    }

    /// The remote `mac` was last seen behind, unless it is a group address, unknown or aged.
    #[inline]
    pub(crate) fn lookup(&self, mac: [u8; 6], now: Instant) -> Option<u16> {
        if is_group(&mac) {
            return None;
        }
        let key = key(mac);
        let mask = self.slots.len() - 1;
        let home = self.home(key);
        (0..PROBE)
            .filter_map(|i| self.slots[(home + i) & mask])
            .find(|e| e.key == key)
            .filter(|e| now.saturating_duration_since(e.seen) < self.aging)
            .map(|e| e.remote)
    }

    /// Live entries: (address, remote index), sorted.
    pub(crate) fn entries(&self, now: Instant) -> Vec<([u8; 6], u16)> {
        let mut v: Vec<([u8; 6], u16)> = self
            .slots
            .iter()
            .flatten()
            .filter(|e| now.saturating_duration_since(e.seen) < self.aging)
            .map(|e| {
                let b = (e.key - 1).to_le_bytes();
                ([b[0], b[1], b[2], b[3], b[4], b[5]], e.remote)
            })
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_moves_ages_and_never_learns_a_group() {
        let t0 = Instant::now();
        let mut f = Fdb::new(16, Duration::from_secs(10));
        let a = [2, 0, 0, 0, 0, 1];
        assert_eq!(f.lookup(a, t0), None);
        f.learn(a, 1, t0);
        assert_eq!(f.lookup(a, t0), Some(1));
        f.learn(a, 2, t0 + Duration::from_secs(5));
        assert_eq!(f.lookup(a, t0 + Duration::from_secs(6)), Some(2));
        assert_eq!(f.lookup(a, t0 + Duration::from_secs(15)), None, "aged");
        f.learn([0xff; 6], 0, t0);
        f.learn([0x01, 0, 0x5e, 0, 0, 1], 0, t0);
        assert_eq!(f.entries(t0).len(), 1);
        // Full: the newest is always found, never more entries than slots.
        for i in 0..200u8 {
            f.learn(
                [2, 0, 0, 0, 1, i],
                0,
                t0 + Duration::from_millis(u64::from(i)),
            );
        }
        assert_eq!(
            f.lookup([2, 0, 0, 0, 1, 199], t0 + Duration::from_secs(1)),
            Some(0)
        );
        assert!(f.entries(t0 + Duration::from_secs(1)).len() <= 16);
    }
}
