//! Ports spread over several shards ([`Lanes`]): the fabric's rules for what comes over a
//! trunk from a shard where such a port has a lane too.

use crate::pkt::PortId;

/// The ports spread over several shards, each shard holding a *lane* of the port under the
/// port's one id (an `AF_XDP` port's queues, each lane with its own sockets): each port with
/// the set of shards it has a lane on (bit `k`: shard `k`). Empty unless some port is spread:
/// the rules below then cost one branch per trunk burst.
///
/// Every lane of a port reaches the same wire, so three rules of the fabric change for what
/// comes over a trunk from shard `s`:
/// * its source is learned at the local lane of the port it entered the switch on (its
///   origin), where there is one, not at the trunk: else two shards could each learn a wire
///   host behind the other's trunk, and a packet between them would be dropped as going
///   back where it came from;
/// * it is never sent to a lane of a port that has a lane on `s` too, flooded or not: `s`
///   sent it to its own lane if it went to the wire at all (the wire would get it twice, or
///   its own frame back);
/// * (as for every port) never to another trunk.
#[derive(Debug, Default)]
pub(crate) struct Lanes(Vec<(PortId, u64)>);

impl Lanes {
    /// Port `port` has lanes on the shards of `mask` (0: it is not spread any more).
    pub(crate) fn set(&mut self, port: PortId, mask: u64) {
        self.0.retain(|&(p, _)| p != port);
        if mask != 0 {
            self.0.push((port, mask));
        }
    }

    /// Whether port `port` has a lane on shard `shard`.
    #[inline]
    pub(crate) fn on(&self, port: PortId, shard: usize) -> bool {
        self.0
            .iter()
            .any(|&(p, m)| p == port && shard < 64 && m & (1 << shard) != 0)
    }

    /// Whether no port is spread.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
