//! The frontend's transmit ring into the switch: one batch parsed and prefetched, its packets
//! handed over in bursts that borrow the frontend's buffers, used entries published once.

use super::QueueSlot;
use crate::pkt::{read_head, Pkt, PortId, EMPTY, MACS, MAX_BURST};
use crate::port::Ingress;
use crate::stats::{bump, DropReason, PortStats};
use virtq::FormatQueue;
use virtq::Prefetch;
use virtq::{Chain, DeviceQueue};

/// One batch from a frontend's transmit ring to `to`: one `available()` load, the batch
/// parsed and every packet's first lines requested before any is read, each packet's header
/// and addresses read once, handed over as bursts, used entries published once (after `to`
/// committed its side). Packets `to` makes wait stay in the ring (unpopped) for the next
/// round; a packet too short to be one is dropped (`invalid`) in its place in the order.
#[inline]
pub(super) fn ingress(
    id: PortId,
    hdr_len: u32,
    tx: &mut QueueSlot,
    chains: &mut Vec<Chain>,
    stats: &PortStats,
    max: usize,
    to: &mut impl Ingress,
) -> usize {
    match tx.q.available() {
        Ok(0) => return 0,
        Ok(_) => tx.worked = true,
        Err(e) => {
            tx.fail(id, stats, e);
            return 0;
        }
    }
    chains.clear();
    // Each chain's first lines, from the one holding the frame's first byte, fetched for
    // writing although pvnet only reads them: a frontend that recycles its buffers (DPDK's
    // mempool, a guest's page pool) soon posts a transmitted buffer for receive, and pvnet
    // then writes the frame there; owned from here, the write finds the line in this core's
    // cache (docs/interop.md has the bounce measured both ways). The header's own line, when
    // the frontend gives it one (DPDK's PMD puts it alone at the end of the line before the
    // frame and compares before it writes, so in steady state it never does), is not asked
    // for: shared in both caches, it is read here without a transfer, where owned it would be
    // taken from the frontend at each of its compares and back at each of pvnet's reads
    // (docs/coherence.md). A header in a descriptor of its own (a chain: DPDK's PMD then
    // writes it in a table of headers, one per ring slot) leaves the frame to the next
    // segment: the lines after such a header are the frontend's next slots, not the frame.
    let pf = Prefetch::write();
    if let Err(e) = tx.q.pop_batch(chains, max, |segs| match segs {
        [h, f, ..] if h.len() <= hdr_len => pf.seg_from(f, hdr_len - h.len(), 2),
        [s, ..] => pf.seg_from(s, hdr_len, 2),
        [] => {}
    }) {
        // Chains popped before the bad one are still taken below.
        tx.fail(id, stats, e);
    }
    // A batch of at most half the budget: this worker keeps up with the frontend, whose time
    // sets the rate (its bursts are 32, the budget 64), so the copies out of its buffers
    // during the hand-over spare it (`virtq::spare_peers`); a fuller one: the worker is
    // behind, and copies as fast as it can.
    virtq::spare_peers(chains.len() * 2 <= max);
    let (taken, bytes, bad) = match &tx.q {
        DeviceQueue::Split(q) => hand_over(q, chains, hdr_len, stats, to),
        DeviceQueue::Packed(q) => hand_over(q, chains, hdr_len, stats, to),
    };
    // Other copies (from pvnet's own buffers) have no peer to spare.
    virtq::spare_peers(false);
    // Every chain taken (delivered, dropped, or too short) is returned, in order.
    tx.q.push_used_all(&chains[..taken], 0);
    // Chains not taken wait in the ring for the next round.
    tx.q.unpop(u16::try_from(chains.len() - taken).unwrap_or(0));
    tx.poll.took(taken, tx.q.size());
    tx.publish(stats);
    bump(&stats.rx_packets, taken as u64);
    bump(&stats.rx_bytes, bytes);
    bump(&stats.drops[DropReason::Invalid as usize], bad);
    taken
}

/// [`ingress`]'s hand-over, for one ring format: the batch's chains to `to` as bursts of
/// packets, in order, until one must wait. Returns the chains taken (delivered, dropped, or
/// too short), the bytes delivered and the chains too short to be a packet.
#[inline(always)]
pub(super) fn hand_over(
    q: &impl FormatQueue,
    chains: &[Chain],
    hdr_len: u32,
    stats: &PortStats,
    to: &mut impl Ingress,
) -> (usize, u64, u64) {
    let (mut bytes, mut bad) = (0u64, 0u64);
    let mut taken = 0;
    let mut pkts = [EMPTY; MAX_BURST];
    while taken < chains.len() {
        // Gather a burst: valid packets up to the next short one (or the burst's room).
        let mut n = 0;
        for c in &chains[taken..] {
            if n == pkts.len() {
                break;
            }
            let segs = q.readable(c);
            let head = if c.readable >= hdr_len + MACS {
                read_head(segs, hdr_len)
            } else {
                None
            };
            let Some((hdr, macs)) = head else {
                break;
            };
            pkts[n] = Pkt {
                segs,
                len: c.readable,
                hdr_len,
                hdr,
                macs,
                hash: 0,
                vlan: 0,
            };
            n += 1;
        }
        let k = if n > 0 {
            to.burst(&pkts[..n], stats)
        } else {
            0
        };
        for p in &pkts[..k] {
            bytes += u64::from(p.frame_len());
        }
        taken += k;
        if k < n {
            break;
        }
        // The chain that ended the gathering, if it was a short one: dropped in its place.
        if n < pkts.len() && taken < chains.len() {
            bad += 1;
            taken += 1;
        }
    }
    (taken, bytes, bad)
}
