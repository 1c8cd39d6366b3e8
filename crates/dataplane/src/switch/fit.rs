//! What a packet's offload metadata asks of a receiver ([`fit`]) and the bounds of software
//! segmentation ([`gso_segments`], [`SEG_BUDGET`]).

use crate::pkt::PortId;
use pvnet_net::features::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6,
};
use pvnet_net::VnetHdr;
use std::time::{Duration, Instant};

/// Segments one sender's GSO packets may be cut into per round: software segmentation is
/// the only work whose size the sender picks (`gso_size`), so it is budgeted, and a sender
/// past its budget waits for the next round while every other port has its turn. At least
/// one packet per round always goes (745 segments at most, see [`gso_segments`]).
pub(crate) const SEG_BUDGET: usize = 1024;
/// Smallest TCP `gso_size` the switch segments: Linux's smallest MSS (`TCP_MIN_MSS`); no TCP
/// stack asks for smaller segments, and at 88 bytes a 64 KiB packet makes at most 745.
pub(crate) const MIN_TCP_GSO_SIZE: u16 = 88;
/// Most segments of one UDP GSO packet (Linux's `UDP_MAX_SEGMENTS`, which
/// `virtio_net_hdr_to_skb` enforces for `GSO_UDP_L4`).
pub(crate) const MAX_UDP_SEGMENTS: usize = 128;

/// Segments a GSO packet of `frame_len` bytes asks for, or `None` if the switch refuses to
/// cut it: a TCP `gso_size` under [`MIN_TCP_GSO_SIZE`], more than [`MAX_UDP_SEGMENTS`] UDP
/// segments, or a `gso_size` of 0. (A few bytes per segment would turn one packet into tens
/// of thousands of frames of work: one sender could stop the switch for everyone.)
pub(crate) fn gso_segments(h: &VnetHdr, frame_len: u32) -> Option<usize> {
    let gso = usize::from(h.gso_size);
    if gso == 0 {
        return None;
    }
    // The sender's header length bounds the payload from above (54: Ethernet, IPv4, TCP).
    let headers = if h.hdr_len > 0 {
        usize::from(h.hdr_len)
    } else {
        54
    };
    let n = (frame_len as usize)
        .saturating_sub(headers)
        .div_ceil(gso)
        .max(1);
    match h.gso_type & !VnetHdr::GSO_ECN {
        VnetHdr::GSO_TCPV4 | VnetHdr::GSO_TCPV6 if h.gso_size < MIN_TCP_GSO_SIZE && n > 1 => None,
        VnetHdr::GSO_UDP_L4 if n > MAX_UDP_SEGMENTS => None,
        _ => Some(n),
    }
}

/// A log line for refused GSO packets at most once a second, with how many were not logged:
/// a hostile sender cannot flood the log.
#[derive(Debug, Default)]
pub(super) struct RateLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLog {
    pub(super) fn note(&mut self, now: Instant, port: PortId, h: &VnetHdr) {
        if self
            .last
            .is_some_and(|l| now.saturating_duration_since(l) < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(
            port,
            gso_type = h.gso_type,
            gso_size = h.gso_size,
            also_since_last = std::mem::take(&mut self.suppressed),
            "GSO packet refused (offload): its gso_size would cut it into too many segments"
        );
        self.last = Some(now);
    }
}

/// How a packet must change for a receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fit {
    /// As it is (flags the receiver cannot take cleared by the receiver).
    Pass,
    /// Complete the partial checksum first.
    Csum,
    /// Segment first.
    Gso,
}

pub(super) fn fit(h: &VnetHdr, offloads: u64) -> Fit {
    let gso = h.gso_type & !VnetHdr::GSO_ECN;
    if gso != VnetHdr::GSO_NONE {
        let tso = match gso {
            VnetHdr::GSO_TCPV4 => VIRTIO_NET_F_GUEST_TSO4,
            VnetHdr::GSO_TCPV6 => VIRTIO_NET_F_GUEST_TSO6,
            _ => return Fit::Gso,
        };
        let ecn = if h.gso_type & VnetHdr::GSO_ECN != 0 {
            VIRTIO_NET_F_GUEST_ECN
        } else {
            0
        };
        let need = tso | ecn | VIRTIO_NET_F_GUEST_CSUM;
        return if offloads & need == need {
            Fit::Pass
        } else {
            Fit::Gso
        };
    }
    if h.flags & VnetHdr::F_NEEDS_CSUM != 0 && offloads & VIRTIO_NET_F_GUEST_CSUM == 0 {
        return Fit::Csum;
    }
    Fit::Pass
}
