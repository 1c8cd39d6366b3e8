//! Direct receive (`direct=true`, docs/afxdp.md): the kernel copies each frame straight into
//! a vhost-user frontend's receive buffer, the hop's only copy.
//!
//! Where the switch sends every frame of the port to one frontend that lends its buffers
//! ([`crate::port::loan`]), each socket's UMEM is rebuilt with that frontend's memory behind
//! the port's own frames ([`XdpDev::rebuild`](crate::sys::xdp::XdpDev::rebuild)), and its
//! buffers are borrowed onto the fill ring, each at its address plus the 12-byte header less
//! the kernel's 256-byte headroom: the frame lands right behind the header. A descriptor past
//! the own frames is a loan: if the switch sends its frame to the lender, the header is
//! written and the loan completed in place (`rx_direct`); if not, the frame is copied out
//! the usual way and the buffer goes back on the fill ring.
//!
//! A few own frames go on the fill ring while loans are short (fewer than [`SHORT`]: up to
//! [`FLOOR`]), so that the port is woken to borrow again; what else arrives while the
//! frontend gives no buffers back the kernel drops (`kernel_drops`), as a NIC without
//! descriptors does, instead of the switch taking it only to queue it for buffers that are
//! not there. While the frontend's egress queue holds packets (which go first) nothing is
//! lent or completed in place. Where the switch sends the port's frames to more than one
//! port, or to one that cannot lend, every own frame goes on the fill ring: one copy, as
//! without direct receive. While loans are being topped up the port asks to be polled
//! ([`Direct::topping_up`]).
//!
//! The shard calls the loans in before the lender's ring stops or restarts or its memory
//! changes, and when this port goes: the sockets are rebuilt without the frontend's memory
//! (the old one closed first: nothing more is written into a buffer on its fill ring), and
//! the loans go back to the lender empty.

use super::AfXdpPort;
use crate::pkt::{read_head, Pkt, PortId, MACS};
use crate::port::loan::{Lending, Loan};
use crate::port::Ingress;
use crate::stats::{bump, DropReason};
use crate::sys::xdp::ring::Ring;
use crate::sys::xdp::{
    data_addr, fill_addr, Meta, FRAME, LEND_CHUNK, RX_FRAMES, TX_FRAMES, XDP_HEADROOM,
};
use pvnet_net::HDR_LEN;
use pvnet_vhost::View;
use std::collections::VecDeque;
use virtq::Seg;

/// Most loans on one socket's fill ring.
const LOANS: u32 = 1024;

/// Loans on a fill ring below which own frames go on it too (up to [`FLOOR`] of them).
const SHORT: usize = 64;

/// Own frames on the fill ring while loans are short.
const FLOOR: usize = 32;

/// Bytes a lent buffer must hold behind its header: all the kernel may write there.
const ROOM: u32 = LEND_CHUNK - XDP_HEADROOM;

/// Direct receive's state: which frontend's memory the sockets map, and each socket's loans.
#[derive(Debug, Default)]
pub(super) struct Direct {
    /// The lender (its id and loan generation) whose memory the sockets' UMEMs were built
    /// with (None: none yet, or called in).
    pub(super) mapped: Option<(PortId, u32)>,
    /// Each socket's loans and spare own frames, by queue.
    pub(super) socks: Vec<Lent>,
}

impl Direct {
    /// Whether a socket's loans are being topped up: fewer than half out and the last round
    /// borrowed some or took frames. The port then asks to be polled (the frontend gives its
    /// buffers back as it reads, and the kernel wakes the port only for a frame: by then the
    /// fill ring may have run dry); once the loans are back, or the frontend gives none, it
    /// may sleep again (a frame in an own frame wakes it).
    pub(super) fn topping_up(&self) -> bool {
        self.socks
            .iter()
            .any(|s| s.busy && s.loans.len() < LOANS as usize / 2)
    }
}

/// One socket's loans and own receive frames.
#[derive(Debug)]
pub(super) struct Lent {
    /// Loans on its fill ring (or written and not handed on yet), in fill order, with their
    /// fill address.
    loans: VecDeque<(u64, Loan)>,
    /// Own receive frames not on the fill ring.
    spare: Vec<u64>,
    /// The last round borrowed or took frames ([`Direct::topping_up`]).
    busy: bool,
}

impl Lent {
    /// Every own receive frame spare (a fresh socket that lends has an empty fill ring).
    pub(super) fn new() -> Self {
        Self {
            loans: VecDeque::with_capacity(LOANS as usize),
            spare: (0..RX_FRAMES)
                .rev()
                .map(|k| u64::from(k) * u64::from(FRAME))
                .collect(),
            busy: false,
        }
    }

    /// The loan given at fill address `fill` (nearly always the oldest: the kernel takes
    /// the fill ring in order).
    fn find(&self, fill: u64) -> Option<usize> {
        if self.loans.front().is_some_and(|l| l.0 == fill) {
            return Some(0);
        }
        self.loans.iter().position(|l| l.0 == fill)
    }

    /// Loan `pos`'s buffer, its frame handed on (or refused), back on the fill ring: the
    /// newest loan now.
    fn lend_again(&mut self, pos: usize, fill: &mut Ring<u64>) {
        if let Some(l) = self.loans.remove(pos) {
            fill.push(l.0);
            self.loans.push_back(l);
        }
    }

    /// An own frame the kernel handed back: spare (the fill ring gets it back at
    /// [`refill`] if loans are short).
    pub(super) fn own_back(&mut self, frame: u64) {
        self.spare.push(frame);
    }

    fn loans(self) -> impl Iterator<Item = Loan> {
        self.loans.into_iter().map(|l| l.1)
    }
}

impl AfXdpPort {
    /// At the start of a round: asks the switch whether the port its frames go to lends
    /// (the round's answer, for [`refill`](Self::refill)), and if it is not the lender the
    /// sockets map, rebuilds them over its memory. A lender that does not lend this round
    /// (its egress queue backed up, another port appeared) changes nothing: the loans out
    /// stay.
    pub(super) fn direct_round(&mut self, to: &mut impl Ingress) -> Lending {
        let lending = to.lender();
        let Some(d) = self.direct.as_ref() else {
            return lending;
        };
        let Lending::Yes(id, gen) = lending else {
            return lending;
        };
        let now = (id, gen);
        if d.mapped == Some(now) {
            return lending;
        }
        let left: usize = d.socks.iter().map(|s| s.loans.len()).sum();
        if left > 0 {
            // Every change of lender or generation calls the loans in first (the shard).
            tracing::warn!(
                port = self.id,
                loans = left,
                "loans of another lender still out: forgotten"
            );
        }
        let views = to.lender_memory();
        self.remap(&views);
        if let Some(d) = self.direct.as_mut() {
            d.mapped = Some(now);
        }
        let mapped = self.dev.queues.iter().all(|x| x.umem.has_regions());
        tracing::info!(
            port = self.id,
            lender = now.0,
            mappings = views.len(),
            direct = mapped,
            "AF_XDP sockets rebuilt over the frontend's memory"
        );
        lending
    }

    /// Rebuilds every socket with `views` behind its own frames (none: its own memory
    /// only); everything its rings held is dropped. A socket that cannot be had again takes
    /// the port down.
    fn remap(&mut self, views: &[View]) {
        self.rebuilt = true;
        let mut i = 0;
        while i < self.dev.queues.len() {
            self.closed_drops += super::closing(self.id, &self.dev.queues[i]);
            // Its transmit frames in flight are gone with it: completed, for DQL.
            let out = TX_FRAMES as usize - self.txq[i].free.len();
            self.completed = self.completed.wrapping_add(u32::try_from(out).unwrap_or(0));
            match self.dev.rebuild(i, views) {
                Ok(()) => {
                    self.txq[i] = super::TxQueue::new();
                    if let Some(d) = self.direct.as_mut() {
                        d.socks[i] = Lent::new();
                    }
                    i += 1;
                }
                Err(e) => {
                    self.txq.remove(i);
                    if let Some(d) = self.direct.as_mut() {
                        d.socks.remove(i);
                    }
                    self.gone(&e);
                }
            }
        }
    }

    /// Calls in the loans of `lender` (every lender if None): the sockets are rebuilt
    /// without the frontend's memory, the old ones closed first, so the kernel writes into
    /// none of the buffers any more. Returns the loans, for their lenders to take back.
    pub(crate) fn call_in(&mut self, lender: Option<PortId>) -> Vec<Loan> {
        let Some(d) = self.direct.as_mut() else {
            return Vec::new();
        };
        let (id, _) = match d.mapped {
            Some(m) if lender.is_none_or(|l| l == m.0) => m,
            _ => return Vec::new(),
        };
        let socks = std::mem::take(&mut d.socks);
        d.socks = socks.iter().map(|_| Lent::new()).collect();
        d.mapped = None;
        self.remap(&[]);
        let loans: Vec<Loan> = socks.into_iter().flat_map(Lent::loans).collect();
        tracing::info!(
            port = self.id,
            lender = id,
            loans = loans.len(),
            "loans called in: AF_XDP sockets rebuilt without the frontend's memory"
        );
        loans
    }

    /// Tops up socket `q`'s fill ring: the lender's buffers first (up to [`LOANS`]), then
    /// own frames while loans are short (all of them while nothing lends). `took`: the
    /// frames the round took from it; `lending`: the round's answer ([`Self::direct_round`]).
    pub(super) fn refill(
        &mut self,
        q: usize,
        took: usize,
        lending: Lending,
        to: &mut impl Ingress,
    ) {
        let (Some(d), Some(x)) = (self.direct.as_mut(), self.dev.queues.get_mut(q)) else {
            return;
        };
        let Some(s) = d.socks.get_mut(q) else {
            return;
        };
        let own_out = RX_FRAMES as usize - s.spare.len();
        let mut free = x.fill.free(RX_FRAMES + LOANS) as usize;
        let lending = match lending {
            _ if d.mapped.is_none() || !x.umem.has_regions() => Lending::No,
            Lending::Yes(id, gen) if Some((id, gen)) != d.mapped => Lending::Later,
            l => l,
        };
        if let Lending::Yes(..) = lending {
            let want = (LOANS as usize).saturating_sub(s.loans.len()).min(free);
            let (fill, umem, loans) = (&mut x.fill, &x.umem, &mut s.loans);
            let n = to.borrow(want, ROOM, &mut |l| {
                // The frame lands at the fill address plus the headroom: behind the header.
                let Some(at) = umem
                    .offset_of(l.buf.as_ptr(), HDR_LEN + l.room)
                    .and_then(|o| (o + u64::from(HDR_LEN)).checked_sub(u64::from(XDP_HEADROOM)))
                else {
                    return false;
                };
                fill.push(at);
                loans.push_back((at, l));
                true
            });
            free -= n;
            s.busy = n > 0 || took > 0;
        } else {
            s.busy = false;
        }
        let want_own = match lending {
            // One copy, as without direct receive: every own frame.
            Lending::No => s.spare.len(),
            // The frontend gives back too few buffers (or its queue waits for them): a few
            // own frames, so that the port is woken and borrows again; the rest of what
            // comes meanwhile the kernel drops, as a NIC without descriptors does, rather
            // than the switch taking it only to queue it for buffers that are not there.
            _ if s.loans.len() < SHORT => FLOOR.saturating_sub(own_out),
            _ => 0,
        };
        for _ in 0..want_own.min(free) {
            let Some(f) = s.spare.pop() else { break };
            x.fill.push(f);
        }
        if x.fill.unsubmitted() > 0 {
            x.fill.submit();
            if x.fill.needs_wakeup() {
                bump(&self.stats.syscalls, 1);
                let _ = x.kick_rx();
            }
        }
    }

    /// Takes the loans' frames at the front of socket `q`'s receive ring, up to `max`: each
    /// completed in place in its lender if the switch sends it there, else copied out the
    /// usual way and its buffer put back on the fill ring. Returns the packets taken and
    /// whether the switch made one wait (it stays on the ring, its loan out).
    pub(super) fn take_lent(
        &mut self,
        q: usize,
        max: usize,
        to: &mut impl Ingress,
    ) -> (usize, bool) {
        let meta = self.dev.meta();
        let stats = &*self.stats;
        let (Some(d), Some(x)) = (self.direct.as_mut(), self.dev.queues.get_mut(q)) else {
            return (0, false);
        };
        let Some(s) = d.socks.get_mut(q) else {
            return (0, false);
        };
        let n = x.rx.ready(u32::try_from(max).unwrap_or(u32::MAX));
        let (mut k, mut direct, mut copied, mut bytes, mut bad) = (0u32, 0u64, 0u64, 0u64, 0u64);
        let mut wait = false;
        while k < n {
            let dsc = x.rx.get(k);
            if data_addr(dsc.addr) < x.umem.own_len() as u64 {
                break;
            }
            let Some(pos) = s.find(fill_addr(dsc.addr)) else {
                // Not a buffer of ours: nothing to give back.
                bad += 1;
                k += 1;
                continue;
            };
            let (fill, loan) = s.loans[pos];
            let Some(len) = lent_frame(fill, &loan, dsc, meta) else {
                bad += 1;
                s.lend_again(pos, &mut x.fill);
                k += 1;
                continue;
            };
            // SAFETY: the loan's frame, as `lent_frame` checked and wrote it.
            let macs = unsafe {
                loan.buf
                    .as_ptr()
                    .add(HDR_LEN as usize)
                    .cast::<[u8; 12]>()
                    .read()
            };
            if to.repay(&loan, len, &macs) {
                s.loans.remove(pos);
                direct += 1;
                bytes += u64::from(len);
                k += 1;
                continue;
            }
            // The usual path: a packet over the buffer, its header all zero.
            // SAFETY: as above; the header's 12 bytes are the loan's own.
            let seg = unsafe {
                std::ptr::write_bytes(loan.buf.as_ptr(), 0, HDR_LEN as usize);
                Seg::from_raw(loan.buf, HDR_LEN + len)
            };
            let first = [seg];
            let Some((hdr, macs)) = read_head(&first, HDR_LEN) else {
                break;
            };
            let pkt = Pkt {
                segs: &first,
                len: len + HDR_LEN,
                hdr_len: HDR_LEN,
                hdr,
                macs,
                hash: 0,
                vlan: 0,
            };
            if to.burst(std::slice::from_ref(&pkt), stats) == 0 {
                wait = true;
                break;
            }
            copied += 1;
            bytes += u64::from(len);
            s.lend_again(pos, &mut x.fill);
            k += 1;
        }
        if k > 0 {
            x.rx.release(k);
            x.fill.submit();
        }
        if direct > 0 {
            to.settle(stats);
        }
        bump(&stats.rx_packets, direct + copied + bad);
        bump(&stats.rx_bytes, bytes);
        bump(&stats.rx_direct, direct);
        bump(&stats.drops[DropReason::Invalid as usize], bad);
        (usize::try_from(direct + copied + bad).unwrap_or(0), wait)
    }
}

/// The frame the kernel wrote behind loan `l`'s header (descriptor `d`; the loan went on the
/// fill ring at `fill`), with a VLAN tag it carried beside the frame put back in (the rest of
/// the frame moved 4 bytes on: a lent buffer has nothing of its own in front of its header).
/// Its length, or None if the descriptor is no frame of this loan (or the tag leaves it no
/// room).
fn lent_frame(fill: u64, l: &Loan, d: libc::xdp_desc, meta: Meta) -> Option<u32> {
    const TAG: u32 = 4;
    if d.options & libc::XDP_PKT_CONTD != 0
        || fill_addr(d.addr) != fill
        || data_addr(d.addr) != fill + u64::from(XDP_HEADROOM)
        || d.len > l.room
        || d.len < MACS + 2
    {
        return None;
    }
    let p = l.buf.as_ptr();
    let hl = HDR_LEN as usize;
    // SAFETY: `p .. p + HDR_LEN + room` is the loan's buffer in pvnet's mapping of the
    // frontend's memory (its generation holds while the loan is out), which the kernel wrote
    // through the UMEM's view of the same pages: the metadata into the header's 12 bytes,
    // the frame (`d.len` <= room bytes, checked) behind them.
    unsafe {
        let m = p.cast::<[u8; 12]>().read();
        let tpid = [m[0], m[1]];
        if meta.vlan && tpid != [0, 0] {
            if d.len + TAG > l.room {
                return None;
            }
            let f = p.add(hl);
            std::ptr::copy(
                f.add(MACS as usize),
                f.add((MACS + TAG) as usize),
                (d.len - MACS) as usize,
            );
            let tci = u16::from_ne_bytes([m[2], m[3]]).to_be_bytes();
            let tag = [tpid[0], tpid[1], tci[0], tci[1]];
            std::ptr::copy_nonoverlapping(tag.as_ptr(), f.add(MACS as usize), TAG as usize);
            return Some(d.len + TAG);
        }
    }
    Some(d.len)
}

#[cfg(test)]
mod tests {
    use super::{lent_frame, Loan, Meta};
    use pvnet_net::HDR_LEN;
    use std::ptr::NonNull;

    /// A loan over `buf` (header first), given at fill address 4096, and the descriptor of a
    /// `len`-byte frame the kernel wrote behind its headroom there.
    fn loan(buf: &mut [u8], len: u32) -> (Loan, libc::xdp_desc) {
        let room = u32::try_from(buf.len()).unwrap() - HDR_LEN;
        let l = Loan {
            lender: 0,
            gen: 0,
            pair: 0,
            head: 0,
            buf: NonNull::new(buf.as_mut_ptr()).unwrap(),
            room,
        };
        let d = libc::xdp_desc {
            addr: 4096 | (256u64 << 48),
            len,
            options: 0,
        };
        (l, d)
    }

    #[test]
    fn a_lent_frame_gets_back_the_vlan_tag_carried_beside_it_behind_its_addresses() {
        let frame: Vec<u8> = (0..60u8).collect();
        let mut buf = vec![0u8; 12 + 70];
        // The metadata the program put in the header's place: TPID (big-endian), TCI.
        buf[..2].copy_from_slice(&0x88a8u16.to_be_bytes());
        buf[2..4].copy_from_slice(&0x2005u16.to_ne_bytes());
        buf[12..72].copy_from_slice(&frame);
        let (l, d) = loan(&mut buf, 60);
        let vlan = Meta {
            vlan: true,
            hash: false,
        };
        assert_eq!(lent_frame(4096, &l, d, vlan), Some(64));
        let mut want = frame[..12].to_vec();
        want.extend_from_slice(&[0x88, 0xa8, 0x20, 0x05]);
        want.extend_from_slice(&frame[12..]);
        assert_eq!(&buf[12..76], &want[..]);

        // No tag, or not asked for: as it came.
        let mut buf = vec![0u8; 12 + 70];
        buf[12..72].copy_from_slice(&frame);
        let (l, d) = loan(&mut buf, 60);
        assert_eq!(lent_frame(4096, &l, d, vlan), Some(60));
        assert_eq!(&buf[12..72], &frame[..]);
    }

    #[test]
    fn a_descriptor_that_is_not_the_loans_frame_is_refused() {
        let mut buf = vec![0u8; 12 + 64];
        buf[..2].copy_from_slice(&0x8100u16.to_be_bytes());
        let vlan = Meta {
            vlan: true,
            hash: false,
        };
        let (l, d) = loan(&mut buf, 62);
        // The tag would not fit behind the header.
        assert_eq!(lent_frame(4096, &l, d, vlan), None);
        assert_eq!(lent_frame(4096, &l, d, Meta::default()), Some(62));
        // Another fill address, another offset, too long, continued, too short.
        assert_eq!(lent_frame(8192, &l, d, Meta::default()), None);
        let moved = libc::xdp_desc {
            addr: 4096 | (300u64 << 48),
            ..d
        };
        assert_eq!(lent_frame(4096, &l, moved, Meta::default()), None);
        assert_eq!(
            lent_frame(4096, &l, libc::xdp_desc { len: 65, ..d }, Meta::default()),
            None
        );
        let contd = libc::xdp_desc {
            options: libc::XDP_PKT_CONTD,
            ..d
        };
        assert_eq!(lent_frame(4096, &l, contd, Meta::default()), None);
        assert_eq!(
            lent_frame(4096, &l, libc::xdp_desc { len: 13, ..d }, Meta::default()),
            None
        );
    }
}
