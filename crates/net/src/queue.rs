//! A virtio-net device's queue numbering (virtio 1.x 5.1.2): queue pair `k` is receiveq`k+1`
//! at index `2k` and transmitq`k+1` at `2k + 1`. The one place that arithmetic is written.

/// A virtio-net queue's index: the pair it belongs to, and which way its packets go.
///
/// Names are the driver's, as in the spec: a receive queue is one the device writes, a
/// transmit queue one it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueIndex(pub u16);

impl QueueIndex {
    /// Pair `pair`'s receive queue (`pair` under 0x8000, the spec's most pairs).
    #[inline]
    pub const fn rx(pair: u16) -> Self {
        Self(2 * pair)
    }

    /// Pair `pair`'s transmit queue.
    #[inline]
    pub const fn tx(pair: u16) -> Self {
        Self(2 * pair + 1)
    }

    /// Every queue of `pairs` pairs, in index order.
    pub fn all(pairs: u16) -> impl Iterator<Item = QueueIndex> {
        (0..pairs).flat_map(|k| [Self::rx(k), Self::tx(k)])
    }

    /// How many queues `pairs` pairs have.
    #[inline]
    pub fn count(pairs: u16) -> usize {
        usize::from(pairs) * 2
    }

    /// The pair it belongs to.
    #[inline]
    pub fn pair(self) -> usize {
        usize::from(self.0 / 2)
    }

    /// Whether it is a transmit queue (the device reads it).
    #[inline]
    pub const fn is_tx(self) -> bool {
        self.0 % 2 == 1
    }

    /// Whether it is a receive queue (the device writes it).
    #[inline]
    pub const fn is_rx(self) -> bool {
        !self.is_tx()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_directions_round_trip() {
        let all: Vec<u16> = QueueIndex::all(3).map(|q| q.0).collect();
        assert_eq!(all, [0, 1, 2, 3, 4, 5]);
        assert_eq!(QueueIndex::count(3), all.len());
        for k in 0..3u16 {
            let (rx, tx) = (QueueIndex::rx(k), QueueIndex::tx(k));
            assert_eq!((rx.pair(), tx.pair()), (usize::from(k), usize::from(k)));
            assert!(rx.is_rx() && !rx.is_tx() && tx.is_tx() && !tx.is_rx());
        }
        assert_eq!(QueueIndex::tx(0x7fff).0, u16::MAX);
    }
}
