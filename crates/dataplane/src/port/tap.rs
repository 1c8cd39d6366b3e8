//! A tap port: the host kernel's side of the switch ([`crate::sys::tap`]).
//!
//! Receiving: one `read` per packet into the port's buffer (a tap takes no batches), the
//! packet handed out from there; one the switch makes wait stays in the buffer for the next
//! round. While the shard polls other rings and the tap had nothing last time, it is read at
//! most every [`TAP_LOOK`] (each look is a syscall); right after every sleep it is read at once.
//! Transmitting: one `writev` per packet straight from the sender's memory (the kernel's copy
//! is the only one); a full kernel queue drops it (`no_buffer`).

use super::{offer_each, read_head, Caps, Ingress, Pkt, PortId, TxOut, MACS, RX_OFFLOADS};
use crate::egress::{Egress, HoldPolicy};
use crate::poll::plan::Settle;
use crate::poll::Idle;
use crate::stats::{bump, DropReason, PortStats};
use crate::sys::tap::{Tap, RECV_BUF_LEN};
use pvnet_net::HDR_LEN;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::event::Armed;
use virtq::mem::read_segs;
use virtq::Seg;

/// How often a tap is read while the shard polls other rings and the tap had nothing last
/// time (each look is a `read` syscall).
pub const TAP_LOOK: Duration = Duration::from_micros(20);

/// Most iovecs of one write (a packet in more pieces goes through the staging buffer).
const MAX_IOV: usize = 64;

/// The kernel's side.
#[derive(Debug)]
pub struct TapPort {
    id: PortId,
    stats: Arc<PortStats>,
    tap: Tap,
    buf: Vec<u8>,
    /// Staging for a packet in more pieces than one write takes.
    staging: Vec<u8>,
    /// Bytes of a packet read but not yet delivered (its receiver was full).
    pending: usize,
    /// Read again at once (the last read returned a packet, or the shard just woke).
    look: bool,
    last_look: Option<Instant>,
    egress: Egress,
}

impl TapPort {
    /// Wraps an open tap (non-blocking, with the 12-byte virtio-net header).
    pub fn new(id: PortId, stats: Arc<PortStats>, tap: Tap) -> Self {
        Self {
            id,
            stats,
            tap,
            buf: vec![0u8; RECV_BUF_LEN],
            staging: vec![0u8; RECV_BUF_LEN],
            pending: 0,
            look: true,
            last_look: None,
            // The kernel never makes a writer wait: nothing is held for a tap.
            egress: Egress::new(HoldPolicy::Bounded(Duration::ZERO)),
        }
    }

    /// The tap's fd, to wait on it.
    pub fn fd(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(&self.tap)
    }

    /// Its egress state.
    pub fn egress(&mut self) -> &mut Egress {
        &mut self.egress
    }
}

/// The iovecs of a packet's bytes from `skip` on (its frame, when the header in front is
/// replaced). Returns how many, or `None` if they do not fit.
fn iovecs(segs: &[Seg<'_>], mut skip: u32, iov: &mut [libc::iovec]) -> Option<usize> {
    let mut n = 0;
    for s in segs {
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let v = iov.get_mut(n)?;
        v.iov_base = s.as_ptr().wrapping_add(skip as usize).cast();
        v.iov_len = (s.len() - skip) as usize;
        skip = 0;
        n += 1;
    }
    Some(n)
}

impl super::Port for TapPort {
    fn id(&self) -> PortId {
        self.id
    }

    fn tx_stats(&self) -> &PortStats {
        &self.stats
    }

    fn kind(&self) -> &'static str {
        "tap"
    }

    fn caps(&self) -> Caps {
        // The kernel takes partial checksums and GSO packets as they are.
        Caps {
            receives: true,
            offloads: RX_OFFLOADS,
        }
    }

    fn rx_burst(&mut self, max: usize, now: Instant, to: &mut impl Ingress) -> usize {
        if self.pending == 0
            && !self.look
            && self
                .last_look
                .is_some_and(|l| now.saturating_duration_since(l) < TAP_LOOK)
        {
            return 0;
        }
        let mut done = 0;
        let mut drained = false;
        while done < max {
            let n = if self.pending > 0 {
                std::mem::take(&mut self.pending)
            } else {
                match self.tap.recv(&mut self.buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => {
                        drained = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(port = self.id, "tap read: {e}");
                        drained = true;
                        break;
                    }
                }
            };
            let len = u32::try_from(n).unwrap_or(0);
            let head = if len >= HDR_LEN + MACS {
                read_head(&[Seg::from_mut(&mut self.buf[..n])], HDR_LEN)
            } else {
                None
            };
            let Some((hdr, macs)) = head else {
                bump(&self.stats.drops[DropReason::Invalid as usize], 1);
                bump(&self.stats.rx_packets, 1);
                done += 1;
                continue;
            };
            let seg = [Seg::from_mut(&mut self.buf[..n])];
            let pkt = Pkt {
                segs: &seg,
                len,
                hdr_len: HDR_LEN,
                hdr,
                macs,
            };
            if to.burst(&[pkt], &self.stats) == 0 {
                self.pending = n;
                break;
            }
            bump(&self.stats.rx_packets, 1);
            bump(&self.stats.rx_bytes, u64::from(len - HDR_LEN));
            done += 1;
        }
        self.look = !drained && self.pending == 0;
        self.last_look = Some(now);
        done
    }

    fn tx_begin(&mut self, _now: Instant, _hint: usize) -> bool {
        true
    }

    /// One `writev` per packet (a tap takes no batches).
    fn tx_burst(&mut self, pkts: &[Pkt<'_>]) -> (usize, TxOut) {
        offer_each(pkts, |p| self.write(p))
    }

    fn tx_commit(&mut self) {}

    /// `Poll` while it drains or holds a packet; else it may sleep: epoll waits on its fd
    /// (level-triggered).
    fn idle(&mut self, _now: Instant, settle: &mut Settle) {
        if self.look || self.pending > 0 {
            settle.idle(Idle::Poll);
        }
    }

    fn arm(&mut self) -> Armed {
        Armed::Empty
    }

    fn disarm(&mut self, slept: bool) {
        if slept {
            self.look = true;
        }
    }

    fn event(&mut self, _token: u16) {
        self.look = true;
    }
}

impl TapPort {
    /// Writes one packet straight from its memory.
    fn write(&mut self, pkt: &Pkt<'_>) -> TxOut {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOV];
        // The tap's header is always 12 bytes: a shorter one is rewritten in front.
        let mut hdr = [0u8; HDR_LEN as usize];
        let (first, skip) = if pkt.hdr_len == HDR_LEN {
            (0, 0)
        } else {
            let mut h = pkt.hdr;
            h.num_buffers = 0;
            h.write(&mut hdr);
            iov[0].iov_base = hdr.as_mut_ptr().cast();
            iov[0].iov_len = hdr.len();
            (1, pkt.hdr_len)
        };
        // Straight from the sender's memory: the kernel's copy is the only one.
        let n = match iovecs(pkt.segs, skip, &mut iov[first..]) {
            Some(n) => first + n,
            None => {
                let len = (pkt.frame_len() as usize).min(self.staging.len() - hdr.len());
                pkt.hdr.write(&mut self.staging);
                let k = read_segs(pkt.segs, pkt.hdr_len, &mut self.staging[hdr.len()..][..len]);
                iov[0].iov_base = self.staging.as_mut_ptr().cast();
                iov[0].iov_len = hdr.len() + k;
                1
            }
        };
        match self.tap.send_iovecs(&iov[..n]) {
            Ok(Some(_)) => {
                bump(&self.stats.tx_packets, 1);
                bump(&self.stats.tx_bytes, u64::from(pkt.frame_len()));
                TxOut::Sent
            }
            Ok(None) => TxOut::Dropped(DropReason::NoBuffer),
            Err(e) => {
                tracing::debug!("tap write refused: {e}");
                TxOut::Dropped(DropReason::Offload)
            }
        }
    }
}
