//! The IOTLB's master copy: what the peer has granted, as it grants and revokes.
//!
//! vhost-user `VHOST_IOTLB_UPDATE` adds a grant (an IOVA range, the peer's user address of it
//! and a permission) and `VHOST_IOTLB_INVALIDATE` revokes a range, which may cut grants in
//! pieces. This map is the control plane's copy, changed one message at a time; the queues
//! translate through immutable snapshots of it ([`MemTable::granted`](crate::MemTable::granted)),
//! rebuilt after each change. Overlapping updates take the newest grant for the overlap
//! (a vIOMMU remapping a page), as the kernel's vhost IOTLB does.

use crate::mem::Grant;
use std::collections::BTreeMap;

/// Why an update was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IotlbError {
    /// Empty, or `iova + size` (or `uaddr + size`) wraps.
    #[error("empty or wrapping range")]
    BadRange,
    /// The grant would take the map past its bound.
    #[error("more than {0} grants")]
    TooMany(usize),
}

/// Grants by IOVA: sorted, never overlapping.
#[derive(Debug, Default, Clone)]
pub struct Iotlb {
    /// Keyed by start IOVA.
    map: BTreeMap<u64, Grant>,
    limit: usize,
}

impl Iotlb {
    /// An empty map that holds at most `limit` grants (a peer that floods updates is refused,
    /// not allowed to grow our memory).
    pub fn new(limit: usize) -> Self {
        Self {
            map: BTreeMap::new(),
            limit,
        }
    }

    /// Number of grants held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Adds a grant; where it overlaps older ones it replaces them.
    pub fn update(&mut self, g: Grant) -> Result<(), IotlbError> {
        if g.len == 0 || g.iova.checked_add(g.len).is_none() || g.uaddr.checked_add(g.len).is_none()
        {
            return Err(IotlbError::BadRange);
        }
        // Removing the overlap may split one grant in two: room for both.
        if self.map.len() + 2 > self.limit {
            return Err(IotlbError::TooMany(self.limit));
        }
        self.remove(g.iova, g.len);
        self.map.insert(g.iova, g);
        Ok(())
    }

    /// Revokes `iova .. iova + len` (saturating at the top of the space): grants wholly
    /// inside go, grants across an edge keep their outside part. Returns whether anything
    /// was revoked.
    ///
    /// A length of 0 revokes everything from `iova` up: QEMU sends a whole-space flush (a
    /// guest's domain-wide invalidation, as Linux's lazy mode issues) as `addr_mask + 1`
    /// with an all-ones mask, which wraps to 0, and the kernel's vhost reads it as the
    /// inclusive range `iova ..= iova - 1`, all of it from 0. Revoking too much only costs
    /// a miss; keeping a revoked range would let the device reach memory the guest has
    /// since given to something else.
    pub fn invalidate(&mut self, iova: u64, len: u64) -> bool {
        let len = if len == 0 {
            (u64::MAX - iova).wrapping_add(1)
        } else {
            len
        };
        if len == 0 {
            // iova == 0 and len == 2^64: the whole space.
            let any = !self.map.is_empty();
            self.map.clear();
            return any;
        }
        self.remove(iova, len)
    }

    /// The grant holding `iova` with at least `perm`, if any (a binary search).
    pub fn find(&self, iova: u64, perm: crate::Perm) -> Option<Grant> {
        let (_, g) = self.map.range(..=iova).next_back()?;
        (iova < g.iova + g.len && g.perm.allows(perm)).then_some(*g)
    }

    /// Whether `iova .. iova + len` is wholly granted with at least `perm`.
    pub fn covers(&self, mut iova: u64, len: u64, perm: crate::Perm) -> bool {
        let Some(end) = iova.checked_add(len) else {
            return false;
        };
        while iova < end {
            match self.find(iova, perm) {
                Some(g) => iova = g.iova + g.len,
                None => return false,
            }
        }
        true
    }

    /// Every grant, by IOVA.
    pub fn grants(&self) -> Vec<Grant> {
        self.map.values().copied().collect()
    }

    /// Every grant, by IOVA, borrowed (what a snapshot is built from).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &Grant> {
        self.map.values()
    }

    /// Keeps only the grants `keep` accepts (those still in shared memory after a new
    /// memory table); returns how many were dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&Grant) -> bool) -> usize {
        let before = self.map.len();
        self.map.retain(|_, g| keep(g));
        before - self.map.len()
    }

    /// Cuts `start .. start + len` out of the map, one grant at a time (no allocation: a
    /// per-packet frontend revokes every buffer).
    fn remove(&mut self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        let mut any = false;
        // The grant starting before `start` that may reach into it keeps its head, and its
        // tail if it reaches past `end` too.
        if let Some((_, &g)) = self.map.range(..start).next_back() {
            if g.iova + g.len > start {
                self.map.insert(
                    g.iova,
                    Grant {
                        len: start - g.iova,
                        ..g
                    },
                );
                self.keep_tail(g, end);
                any = true;
            }
        }
        // Every grant starting inside goes; the last may keep its tail (inserted at `end`,
        // outside the range, so the loop ends).
        while let Some((&k, &g)) = self.map.range(start..end).next() {
            self.map.remove(&k);
            self.keep_tail(g, end);
            any = true;
        }
        any
    }

    /// Keeps the part of grant `g` from `end` on, if it reaches past `end`.
    fn keep_tail(&mut self, g: Grant, end: u64) {
        let g_end = g.iova + g.len;
        if g_end > end && end > g.iova {
            let cut = end - g.iova;
            self.map.insert(
                end,
                Grant {
                    iova: end,
                    len: g_end - end,
                    uaddr: g.uaddr + cut,
                    perm: g.perm,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Perm;

    fn g(iova: u64, len: u64, uaddr: u64) -> Grant {
        Grant {
            iova,
            len,
            uaddr,
            perm: Perm::ReadWrite,
        }
    }

    #[test]
    fn invalidation_cuts_grants_at_its_edges() {
        let mut t = Iotlb::new(16);
        t.update(g(0x1000, 0x3000, 0x10_0000)).unwrap();
        assert!(t.invalidate(0x2000, 0x1000));
        assert_eq!(
            t.grants(),
            vec![g(0x1000, 0x1000, 0x10_0000), g(0x3000, 0x1000, 0x10_2000)]
        );
        assert!(!t.covers(0x2000, 1, Perm::Read));
        assert!(t.covers(0x1000, 0x1000, Perm::Write));
        assert!(!t.invalidate(0x2000, 0x1000), "nothing left there");
        assert!(t.invalidate(0, u64::MAX), "everything");
        assert!(t.is_empty());
        // A length of 0 is a flush from there up (QEMU's whole-space flush is 0 + 0).
        t.update(g(0x1000, 0x1000, 0x10_0000)).unwrap();
        t.update(g(0x8000, 0x1000, 0x10_0000)).unwrap();
        assert!(t.invalidate(0x4000, 0));
        assert_eq!(t.grants(), vec![g(0x1000, 0x1000, 0x10_0000)]);
        assert!(t.invalidate(0, 0));
        assert!(t.is_empty());
    }

    #[test]
    fn a_newer_grant_replaces_the_overlap() {
        let mut t = Iotlb::new(16);
        t.update(g(0x1000, 0x2000, 0x10_0000)).unwrap();
        t.update(Grant {
            perm: Perm::Read,
            ..g(0x1800, 0x1000, 0x20_0000)
        })
        .unwrap();
        assert_eq!(t.len(), 3);
        assert!(t.covers(0x1000, 0x800, Perm::Write));
        assert!(!t.covers(0x1800, 1, Perm::Write));
        assert!(t.covers(0x1000, 0x2000, Perm::Read));
    }

    #[test]
    fn bad_updates_are_refused() {
        let mut t = Iotlb::new(2);
        assert_eq!(t.update(g(1, 0, 0)), Err(IotlbError::BadRange));
        assert_eq!(t.update(g(u64::MAX, 2, 0)), Err(IotlbError::BadRange));
        assert_eq!(t.update(g(0, 2, u64::MAX)), Err(IotlbError::BadRange));
        t.update(g(0, 1, 0)).unwrap();
        assert_eq!(t.update(g(8, 1, 0)), Err(IotlbError::TooMany(2)));
    }

    proptest::proptest! {
        /// Updates and invalidations against a byte-by-byte model of a small IOVA space:
        /// after every step each address translates (user address and permission) exactly as
        /// the model says, and the grants stay sorted and apart.
        #[test]
        #[allow(clippy::cast_possible_truncation)] // addresses below 88
        fn matches_a_byte_model(ops in proptest::collection::vec(
            (proptest::bool::ANY, 0u64..64, 1u64..24, 0u64..4, 1u8..4), 1..40)) {
            let mut t = Iotlb::new(usize::MAX);
            let mut model: [Option<(u64, Perm)>; 88] = [None; 88];
            for (update, iova, len, base, perm) in ops {
                let perm = Perm::from_bits(perm).unwrap();
                if update {
                    let uaddr = 0x1000 * (base + 1) + iova;
                    t.update(Grant { iova, len, uaddr, perm }).unwrap();
                    for a in iova..iova + len {
                        model[a as usize] = Some((uaddr + a - iova, perm));
                    }
                } else {
                    let any = model[iova as usize..(iova + len) as usize].iter().any(Option::is_some);
                    proptest::prop_assert_eq!(t.invalidate(iova, len), any);
                    model[iova as usize..(iova + len) as usize].fill(None);
                }
                for (a, m) in model.iter().enumerate() {
                    let got = t.find(a as u64, Perm::Read).or_else(|| t.find(a as u64, Perm::Write));
                    let got = got.map(|g| (g.uaddr + a as u64 - g.iova, g.perm));
                    proptest::prop_assert_eq!(got, *m, "address {}", a);
                }
                let gs = t.grants();
                proptest::prop_assert!(gs.windows(2).all(|w| w[0].iova + w[0].len <= w[1].iova));
                proptest::prop_assert!(gs.iter().all(|g| g.len > 0));
            }
        }
    }
}
