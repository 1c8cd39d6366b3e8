//! Direct receive (docs/no-copy.md): a kernel port reads packets straight into the chains of
//! this frontend's open receive batch, which are then completed in place.

use super::rx::{deliver, Delivered, RxSide};
use super::{QueuePair, VhostPort};
use crate::port::Port;
use pvnet_net::HDR_LEN;
use std::time::Instant;
use virtq::Seg;

impl VhostPort {
    /// Whether a kernel port may read packets straight into this frontend's receive buffers
    /// (direct receive, docs/no-copy.md): its header is the kernel's 12 bytes, nothing
    /// waits in its egress queue (what waits goes first), and one receive ring runs (with
    /// more, the ring depends on the packet's flow, known only once the kernel wrote it:
    /// lending one ring's buffers would put every flow on it).
    fn lends(&self) -> bool {
        self.hdr_len == HDR_LEN
            && !Port::backlogged(self)
            && self.qps.iter().flatten().filter(|qp| qp.rx_runs()).count() <= 1
    }

    /// [`Port::lend`]: when it lends, its receive batch opened as for a transmit batch.
    pub(super) fn lend_rx(&mut self, now: Instant, want: usize) -> Option<usize> {
        if !self.lends() || !Port::tx_begin(self, now, want) {
            return None;
        }
        Some(self.lent_count())
    }

    /// The open receive batch's chains not filled yet (0 when none is open).
    fn lent_count(&self) -> usize {
        match self.qps.get(self.tx_qp).and_then(Option::as_ref) {
            Some(qp) if qp.out.open && qp.rx_runs() => qp.out.rxb.remaining(),
            _ => 0,
        }
    }

    /// The writable segments of the open batch's `k`-th chain not filled yet (none past the
    /// batch). They stay the frontend's buffers, popped for this batch: a kernel port reads
    /// into them and then completes each with [`take_in_place`](Self::take_in_place), in
    /// order; the rest go back to the ring at the commit.
    pub(super) fn lent_chain(&self, k: usize) -> &[Seg<'_>] {
        let Some(QueuePair {
            rx: Some(rx), out, ..
        }) = self.qps.get(self.tx_qp).and_then(Option::as_ref)
        else {
            return &[];
        };
        out.rxb
            .chains
            .get(out.rxb.next + k)
            .map_or(&[], |c| rx.q.writable(c))
    }

    /// Completes the next lent chains in place: they hold a packet of `len` bytes (header
    /// included) that the kernel wrote across them in order, each filled before the next.
    /// The caller knows it lies within the chains it lent that read. False, nothing consumed,
    /// if the chains cannot take it (more than a packet may merge, the ring stopped).
    pub(super) fn take_in_place(&mut self, len: u32) -> bool {
        let frame_len = len.saturating_sub(self.hdr_len);
        self.rx_side()
            .is_some_and(|mut side| side.in_place(len, frame_len))
    }
}

impl RxSide<'_> {
    /// Direct receive: the next chains of the batch already hold a packet of `len` bytes,
    /// header first, written there by the kernel (the hop's one copy), filling each in turn.
    /// Completes it in place: `num_buffers` set, a used entry per chain it fills, counted as
    /// any delivery. False, with nothing consumed, if the batch's chains cannot hold it (more
    /// than a packet may merge, or none left).
    pub(super) fn in_place(&mut self, len: u32, frame_len: u32) -> bool {
        match deliver(&mut self.rx.q, &mut self.st.rxb, len, |_, _, _, n| n) {
            Ok(Delivered::Done) => {
                self.st.sent[0] += 1;
                self.st.sent[1] += u64::from(frame_len);
                self.st.egress.sent();
                true
            }
            Ok(_) => false,
            Err(e) => {
                self.rx.fail(self.id, self.stats, e);
                false
            }
        }
    }
}
