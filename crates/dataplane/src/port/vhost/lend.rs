//! Direct receive (docs/no-copy.md): a kernel port reads packets straight into the chains of
//! this frontend's open receive batch, which are then completed in place; an `AF_XDP` port's
//! kernel writes frames into chains lent to it across rounds (loans, docs/afxdp.md).

use super::rx::{deliver, Delivered, RxSide};
use super::{QueuePair, QueueSlot, VhostPort};
use crate::port::loan::{Lending, Loan};
use crate::port::Port;
use pvnet_net::{HDR_LEN, NUM_BUFFERS_OFF};
use std::ptr::NonNull;
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

/// Loans (direct receive across rounds, [`crate::port::loan`]).
impl VhostPort {
    /// The pair whose receive buffers it lends across rounds, if it does now: 12-byte
    /// headers, one receive ring running (its flow is not known before the frame is
    /// written), no `VIRTIO_F_IN_ORDER` (a loan completes when its frame comes, not in the
    /// order the ring gave it), no IOTLB (its buffers' addresses could be revoked under the
    /// device) and no dirty log (the device's writes would go unmarked). (It lends now only
    /// if nothing waits in that pair's egress queue: [`lender`](Self::lender).)
    fn lending_pair(&self) -> Option<usize> {
        use pvnet_vhost::features::VIRTIO_F_IN_ORDER;
        if self.hdr_len != HDR_LEN || self.features & VIRTIO_F_IN_ORDER != 0 {
            return None;
        }
        let mut running = self
            .qps
            .iter()
            .enumerate()
            .filter(|(_, qp)| qp.as_ref().is_some_and(QueuePair::rx_runs));
        let (k, qp) = running.next()?;
        if running.next().is_some() {
            return None;
        }
        let qp = qp.as_ref()?;
        let rx = qp.rx.as_ref()?;
        (rx.live && !rx.q.logging() && !rx.q.mem().is_granted()).then_some(k)
    }

    /// Whether the pair's egress queue holds packets: they wait for its buffers and go
    /// first, so nothing is lent or completed in place meanwhile (a frame in place would
    /// overtake them).
    fn lending_waits(&self, k: usize) -> bool {
        self.qps
            .get(k)
            .and_then(Option::as_ref)
            .is_some_and(|qp| qp.out.egress.backlogged())
    }

    /// Whether it lends now, and its loan generation: it changes whenever a ring starts or
    /// stops or the memory changes, and a loan of another generation is void.
    pub(crate) fn lender(&self) -> Lending {
        match self.lending_pair() {
            None => Lending::No,
            Some(k) if self.lending_waits(k) => Lending::Later,
            Some(_) => Lending::Yes(self.id, self.loan_gen),
        }
    }

    /// The memory its loans lie in (pvnet's mappings of the frontend's files, to map again).
    pub(crate) fn loan_memory(&self) -> Vec<pvnet_vhost::View> {
        self.lending_pair()
            .and_then(|k| self.qps[k].as_ref()?.rx.as_ref())
            .and_then(|rx| pvnet_vhost::table_views(rx.q.mem()))
            .unwrap_or_default()
    }

    /// Lends up to `want` receive buffers (never more than 7/8 of its ring at once, so that
    /// what reaches it another way finds buffers), each with at least `room` bytes behind
    /// the header in the chain's first piece, to `out`, in ring order; stops at the first
    /// chain that has less, or that `out` refuses (given back: it takes the usual path).
    /// Only between bursts (no receive batch open). Returns how many.
    pub(crate) fn loan(
        &mut self,
        want: usize,
        room: u32,
        out: &mut dyn FnMut(Loan) -> bool,
    ) -> usize {
        let Some(k) = self.lending_pair().filter(|&k| !self.lending_waits(k)) else {
            return 0;
        };
        let (id, gen, hdr) = (self.id, self.loan_gen, self.hdr_len);
        let Some(qp) = self.qps[k].as_mut() else {
            return 0;
        };
        let Some(rx) = QueueSlot::usable(&mut qp.rx) else {
            return 0;
        };
        if qp.out.open {
            return 0;
        }
        let size = usize::from(rx.q.size());
        let cap = size - size / 8;
        let want = want.min(cap.saturating_sub(self.loaned));
        if want == 0 {
            return 0;
        }
        let avail = match rx.q.available() {
            Ok(n) => usize::from(n),
            Err(e) => {
                rx.fail(id, &qp.stats, e);
                return 0;
            }
        };
        let mut n = 0;
        while n < want.min(avail) {
            let c = match rx.q.pop() {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    rx.fail(id, &qp.stats, e);
                    break;
                }
            };
            let loan =
                rx.q.writable(&c)
                    .first()
                    .filter(|s| s.len() >= hdr.saturating_add(room))
                    .and_then(|s| {
                        Some(Loan {
                            lender: id,
                            gen,
                            pair: u16::try_from(k).ok()?,
                            head: c.head,
                            buf: NonNull::new(s.as_ptr())?,
                            room: s.len() - hdr,
                        })
                    });
            if !loan.is_some_and(&mut *out) {
                rx.q.unpop(1);
                break;
            }
            n += 1;
        }
        self.loaned += n;
        n
    }

    /// Completes loan `l`: the device wrote a frame of `len` bytes behind its header. The
    /// header is written (no offload, `num_buffers` 1) and the used entry pushed; published
    /// and counted at the commit. False, nothing done, if the loan is void (its generation
    /// past), the ring does not run, or packets wait in the egress queue (the frame goes
    /// behind them).
    pub(crate) fn repay(&mut self, l: &Loan, len: u32) -> bool {
        if l.gen != self.loan_gen || len > l.room || self.lending_waits(usize::from(l.pair)) {
            return false;
        }
        let Some(qp) = self
            .qps
            .get_mut(usize::from(l.pair))
            .and_then(Option::as_mut)
        else {
            return false;
        };
        let Some(rx) = QueueSlot::usable(&mut qp.rx) else {
            return false;
        };
        let mut h = [0u8; HDR_LEN as usize];
        h[NUM_BUFFERS_OFF as usize] = 1;
        // SAFETY: the loan's buffer is a chain of this generation's ring, popped and not yet
        // used, with at least `HDR_LEN + room` bytes in pvnet's mapping of the frontend's
        // memory (checked when it was lent), which this generation's table keeps mapped.
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), l.buf.as_ptr(), h.len()) };
        rx.q.push_used(l.head, HDR_LEN + len);
        qp.repaid[0] += 1;
        qp.repaid[1] += u64::from(len);
        self.loaned = self.loaned.saturating_sub(1);
        true
    }

    /// Takes loans back unused (the device let go of them without a frame: its socket
    /// closed): each completed empty (a used entry of length 0, which a driver drops as a
    /// short packet and posts again), and published. Loans of a past generation are only
    /// forgotten (their ring is gone).
    pub(crate) fn unloan(&mut self, loans: &[Loan]) {
        let mut back = 0u64;
        for l in loans.iter().filter(|l| l.gen == self.loan_gen) {
            let Some(qp) = self
                .qps
                .get_mut(usize::from(l.pair))
                .and_then(Option::as_mut)
            else {
                continue;
            };
            if let Some(rx) = QueueSlot::usable(&mut qp.rx) {
                rx.q.push_used(l.head, 0);
                back += 1;
            }
        }
        self.loaned = self.loaned.saturating_sub(loans.len());
        if back > 0 {
            for qp in self.qps.iter_mut().flatten() {
                if let Some(rx) = QueueSlot::usable(&mut qp.rx) {
                    rx.publish(&qp.stats);
                }
            }
            tracing::info!(
                port = self.id,
                buffers = back,
                "lent receive buffers called in: given back empty"
            );
        }
    }

    /// A ring started or stopped or the memory changed: every loan out is void.
    pub(super) fn new_loan_generation(&mut self) {
        self.loan_gen = self.loan_gen.wrapping_add(1);
        self.loaned = 0;
    }
}
