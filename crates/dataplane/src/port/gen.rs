//! A generator: numbered bench frames (`crate::frame`), paced or as fast as receivers take
//! them, then an end marker carrying the count. The one producer behind `pvnet switch`'s gen
//! ports and `pvnet backend --role gen`.
//!
//! It starts when something can receive its frames (after `delay`), and its frames wait for
//! buffers as long as it takes: nothing is in flight yet, so waiting loses nothing.

use super::Ingress;
use crate::flow::flow_hash;
use crate::frame;
use crate::pkt::{Caps, Pkt, PortId, TxOut, MAX_BURST};
use crate::poll::plan::Settle;
use crate::poll::Idle;
use crate::port::sink::Counting;
use crate::stats::{bump, PortStats};
use pvnet_net::{VnetHdr, HDR_LEN};
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::Armed;
use virtq::Seg;

/// Longest a generator waiting for buffers lets the shard sleep (its end marker is due when
/// its duration ends, whether or not the receiver kicks).
pub(crate) const WAIT_CAP: Duration = Duration::from_millis(10);
/// Consecutive frames of one flow when a generator spreads its frames over flows.
pub(crate) const FLOW_RUN: u64 = 32;

/// Generator settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenSpec {
    /// Ethernet frame length.
    pub frame_len: usize,
    /// Packets per second; 0: as fast as receivers take them.
    pub rate: u64,
    /// Stop after this long (then the end marker goes out); `None`: run until the switch stops.
    pub duration: Option<Duration>,
    /// Wait this long after a receiver appears before the first frame (a frontend that is
    /// still starting may discard what arrives early: DPDK's virtio PMD flushes its receive
    /// rings in `dev_start`, after the rings run).
    pub delay: Duration,
    /// Source address of the frames.
    pub src: [u8; 6],
    /// Destination address of the frames.
    pub dst: [u8; 6],
    /// Flows the frames are spread over (1: one): frame `n` has `src` with its fifth byte
    /// xor `n / 32 % flows` (runs of 32 frames per flow, as a sender's bursts come), so a
    /// multiqueue receiver's flow hash spreads them over its rings (a flow's frames keep
    /// their order; the sequence numbers interleave across flows). (Not the last byte: the
    /// default addresses differ only there, and a source equal to the destination would be
    /// filtered.)
    pub flows: u8,
}

/// Produces.
#[derive(Debug)]
pub struct GenPort {
    id: PortId,
    stats: Arc<PortStats>,
    /// A port of its own (counts what it sends as its `rx_packets`; polls while its receiver
    /// is full, as a switch port always did) or behind a frontend's port (bench role gen: that
    /// port counts the frames; a full receiver is waited on through its ring's policy).
    counting: Counting,
    spec: GenSpec,
    /// [`MAX_BURST`] copies of header + frame, each numbered before its burst goes out.
    frames: Vec<u8>,
    /// Bytes of one (header + frame).
    frame_bytes: usize,
    seq: u64,
    started: Option<Instant>,
    /// When a receiver appeared (the delay runs from here).
    armed: Option<Instant>,
    /// Its last burst stopped at a frame its receiver had no room for.
    waiting: bool,
    done: bool,
    /// Each flow's hash ([`Pkt::hash`]), from its frame once: its packets carry it, so that
    /// steering them onto a multiqueue port's rings reads no frame.
    hashes: Vec<u32>,
}

/// The flows of consecutive frames, from frame number `first` on: frame `n` belongs to flow
/// `n / FLOW_RUN % flows` (the end marker, `first` None, to the first flow). Stepped once per
/// frame, with no division per frame.
struct Flows {
    id: u8,
    /// Frames of the current run left.
    left: u64,
    flows: u8,
}

impl Flows {
    fn new(first: Option<u64>, flows: u8) -> Self {
        let flows = flows.max(1);
        let (id, left) = first.map_or((0, u64::MAX), |s| {
            (
                u8::try_from(s / FLOW_RUN % u64::from(flows)).unwrap_or(0),
                FLOW_RUN - s % FLOW_RUN,
            )
        });
        Self { id, left, flows }
    }

    /// The next frame's flow.
    #[inline]
    fn step(&mut self) -> u8 {
        if self.left == 0 {
            self.id = if self.id + 1 >= self.flows {
                0
            } else {
                self.id + 1
            };
            self.left = FLOW_RUN;
        }
        self.left -= 1;
        self.id
    }
}

/// The byte of a frame (and of its addresses) that tells its flow apart: the source
/// address's fifth (destination 6 bytes, then the source's).
const FLOW_BYTE: usize = 6 + 4;

/// That byte for `flow` of a generator whose source address is `src`.
fn flow_byte(src: [u8; 6], flow: u8) -> u8 {
    src[4] ^ flow
}

impl GenPort {
    /// A generator (see [`Counting`]).
    pub fn new(id: PortId, stats: Arc<PortStats>, spec: GenSpec, counting: Counting) -> Self {
        let len = spec.frame_len.max(frame::MIN_FRAME);
        let frame_bytes = HDR_LEN as usize + len;
        let mut frames = vec![0u8; frame_bytes * MAX_BURST];
        for f in frames.chunks_exact_mut(frame_bytes) {
            frame::write_template(&mut f[HDR_LEN as usize..], len, spec.src, spec.dst);
        }
        let h = HDR_LEN as usize;
        let hashes = (0..spec.flows.max(1))
            .map(|flow| {
                let mut f = frames[h..frame_bytes].to_vec();
                f[FLOW_BYTE] = flow_byte(spec.src, flow);
                (flow_hash(&f) >> 32) as u32
            })
            .collect();
        Self {
            id,
            stats,
            counting,
            spec,
            frames,
            frame_bytes,
            seq: 0,
            started: None,
            armed: None,
            waiting: false,
            done: false,
            hashes,
        }
    }

    /// Frames owed by now at the configured rate (all it may send when unpaced).
    fn owed(&self, now: Instant, batch: usize) -> usize {
        let Some(t0) = self.started else { return 0 };
        if self.spec.rate == 0 {
            return batch;
        }
        let ns = now.saturating_duration_since(t0).as_nanos();
        let due = ns.saturating_mul(u128::from(self.spec.rate)) / 1_000_000_000;
        let owed = due.saturating_sub(u128::from(self.seq));
        usize::try_from(owed).map_or(batch, |n| n.min(batch))
    }

    /// When the next paced frame is due.
    fn next_due(&self) -> Option<Instant> {
        let t0 = self.started?;
        (self.spec.rate > 0 && !self.done)
            .then(|| t0 + Duration::from_secs_f64((self.seq + 1) as f64 / self.spec.rate as f64))
    }
}

impl super::Port for GenPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn tx_stats(&self) -> &PortStats {
        &self.stats
    }

    fn caps(&self) -> Caps {
        Caps {
            receives: false,
            offloads: 0,
            patient: true,
            hairpin: false,
        }
    }

    /// Up to `max` frames (what the rate owes), or the end marker once the duration passed.
    /// Frames `to` makes wait are generated again next round (same numbers).
    fn rx_burst(&mut self, max: usize, now: Instant, to: &mut impl Ingress) -> usize {
        if self.done {
            return 0;
        }
        if self.started.is_none() {
            if !to.has_receiver() {
                self.armed = None;
                return 0;
            }
            let a = *self.armed.get_or_insert(now);
            if now.saturating_duration_since(a) < self.spec.delay {
                return 0;
            }
        }
        let t0 = *self.started.get_or_insert(now);
        let finishing = self
            .spec
            .duration
            .is_some_and(|d| now.saturating_duration_since(t0) >= d);
        let owed = if finishing { 1 } else { self.owed(now, max) };
        if owed == 0 {
            return 0;
        }
        let owed = owed.min(MAX_BURST);
        let len = u32::try_from(self.frame_bytes).unwrap_or(0);
        let h = HDR_LEN as usize;
        let macs: [u8; 12] = self.frames[h..h + 12].try_into().unwrap_or([0; 12]);
        let (seq, id) = (self.seq, self.id);
        let (src, flows) = (self.spec.src, self.spec.flows);
        // Spread over flows (`flows` > 1): frame `k` gets its flow's source address
        // (`flow_byte`), the flow noted in `flow[k]` for the packet's addresses.
        let mut flow = [0u8; MAX_BURST];
        let mut steps = (flows > 1).then(|| Flows::new((!finishing).then_some(seq), flows));
        // Only the burst's own entries are written (filling all MAX_BURST segments and
        // packets first cost more than the burst's frames at 32 a burst).
        let mut segs = [const { MaybeUninit::<Seg<'_>>::uninit() }; MAX_BURST];
        let mut n = 0;
        for (k, f) in self
            .frames
            .chunks_exact_mut(self.frame_bytes)
            .take(owed)
            .enumerate()
        {
            if finishing {
                frame::set_end(&mut f[h..], seq);
            } else {
                frame::set_seq(&mut f[h..], seq + k as u64);
            }
            if let Some(st) = steps.as_mut() {
                flow[k] = st.step();
                f[h + FLOW_BYTE] = flow_byte(src, flow[k]);
            }
            segs[k].write(Seg::from_mut(f));
            n = k + 1;
        }
        // SAFETY: the loop above wrote segs[..n], each once.
        let segs: &[Seg<'_>] = unsafe { std::slice::from_raw_parts(segs.as_ptr().cast(), n) };
        let hash0 = self.hashes.first().copied().unwrap_or(0);
        let mut pkts = [const { MaybeUninit::<Pkt<'_>>::uninit() }; MAX_BURST];
        for (k, (p, seg)) in pkts.iter_mut().zip(segs).enumerate() {
            let (mut macs, mut hash) = (macs, hash0);
            if flows > 1 {
                macs[FLOW_BYTE] = flow_byte(src, flow[k]);
                hash = self.hashes.get(usize::from(flow[k])).copied().unwrap_or(0);
            }
            p.write(Pkt {
                segs: std::slice::from_ref(seg),
                len,
                hdr_len: HDR_LEN,
                hdr: VnetHdr::default(),
                macs,
                hash,
                vlan: 0,
            });
        }
        // SAFETY: the loop above wrote pkts[..n] (one per segment), each once.
        let pkts: &[Pkt<'_>] = unsafe { std::slice::from_raw_parts(pkts.as_ptr().cast(), n) };
        let sent = to.burst(pkts, &self.stats);
        self.waiting = sent < n;
        if finishing {
            if sent == 1 {
                self.done = true;
                tracing::info!(
                    port = id,
                    frames = seq + 1,
                    "generator done (end marker sent)"
                );
            }
        } else {
            self.seq += sent as u64;
        }
        if self.counting == Counting::Own {
            bump(&self.stats.rx_packets, sent as u64);
            bump(&self.stats.rx_bytes, sent as u64 * u64::from(len - HDR_LEN));
        }
        // A finishing round counts as work even if the marker found no room: try again.
        sent.max(usize::from(finishing))
    }

    fn tx_begin(&mut self, _now: Instant, _hint: usize) -> bool {
        false
    }

    fn tx_burst(&mut self, _pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        (0, TxOut::Dropped(crate::stats::DropReason::PortDown))
    }

    fn tx_commit(&mut self) {}

    /// `Poll` while unpaced frames are owed; `Until` the next paced frame, or the end of the
    /// start delay; nothing once done. A generator behind a frontend's port that waits for its
    /// buffers leaves the waiting to that ring (its policy; a kick when buffers come), but
    /// still has an end to keep: it wakes the shard at least every [`WAIT_CAP`].
    fn idle(&mut self, now: Instant, settle: &mut Settle) {
        if self.done {
            return;
        }
        if self.started.is_none() {
            if let Some(a) = self.armed {
                settle.wake_by(a + self.spec.delay);
            }
            return;
        }
        if self.waiting && self.counting == Counting::Behind {
            settle.wake_by(now + WAIT_CAP);
            return;
        }
        settle.idle(match self.next_due() {
            None => Idle::Poll,
            Some(t) if t <= now => Idle::Poll,
            Some(t) => Idle::Until(t),
        });
    }

    fn arm(&mut self) -> Armed {
        Armed::Empty
    }

    fn disarm(&mut self, _slept: bool) {}

    fn event(&mut self, _token: u16) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::Port;

    #[test]
    fn flows_step_through_runs_of_frames() {
        for flows in [2u8, 3, 64, 255] {
            for first in [0u64, 1, 31, 32, 63, 1000, u64::from(u32::MAX) * 7 + 5] {
                let mut f = Flows::new(Some(first), flows);
                for n in first..first + 3 * FLOW_RUN {
                    let want = u8::try_from(n / FLOW_RUN % u64::from(flows)).expect("flow");
                    assert_eq!(f.step(), want, "flows {flows}, frame {n}");
                }
            }
            // The end marker goes out from the first flow's address.
            assert_eq!(Flows::new(None, flows).step(), 0);
        }
    }

    /// Records each packet's carried hash beside the one its bytes give.
    struct Hashes(Vec<(u32, u32)>);

    impl Ingress for Hashes {
        fn burst(&mut self, pkts: &[Pkt<'_>], _stats: &PortStats) -> usize {
            for p in pkts {
                let mut b = vec![0u8; p.len as usize];
                virtq::read_segs(p.segs, p.hdr_len, &mut b);
                self.0.push((p.hash, (flow_hash(&b) >> 32) as u32));
            }
            pkts.len()
        }

        fn has_receiver(&self) -> bool {
            true
        }
    }

    #[test]
    fn every_frame_carries_its_flows_hash() {
        const BURSTS: usize = 70;
        for flows in [1u8, 5, 64] {
            let spec = GenSpec {
                frame_len: 64,
                rate: 0,
                duration: None,
                delay: Duration::ZERO,
                src: [2, 0, 0, 0, 0, 1],
                dst: [2, 0, 0, 0, 0, 2],
                flows,
            };
            let mut g = GenPort::new(1, Arc::default(), spec, Counting::Own);
            let mut got = Hashes(Vec::new());
            let now = Instant::now();
            // Enough bursts for every flow's run to come round.
            for _ in 0..BURSTS {
                g.rx_burst(MAX_BURST, now, &mut got);
            }
            assert_eq!(got.0.len(), BURSTS * MAX_BURST);
            let mut distinct: Vec<u32> = got.0.iter().map(|h| h.0).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), usize::from(flows), "{flows} flows");
            for (k, (carried, computed)) in got.0.iter().enumerate() {
                assert_eq!(carried, computed, "{flows} flows, frame {k}");
            }
        }
    }
}
