//! The vocabulary every layer of the dataplane shares: a packet on its way through ([`Pkt`]),
//! what became of one offered to a port ([`TxOut`]), what of it the switch reuses before the
//! commit ([`Staged`]), what a port takes ([`Caps`]), a port's id, and the sizes of a burst.
//! It names nothing above it (only `stats`' drop reasons and `flow`'s hash), so `egress`,
//! `port`, `switch` and `worker` all build on it.

use crate::stats::DropReason;
use pvnet_net::{VnetHdr, HDR_LEN, HDR_LEN_LEGACY};
use virtq::Seg;

/// A port's id: unique in the process, the same number the vhost-user backend gives the
/// frontend's connection (`pvnet_vhost::backend::PortId`).
pub(crate) type PortId = u32;

/// Most packets in one burst: what a source hands over at once (its stack holds them).
pub(crate) const MAX_BURST: usize = 64;

/// Most receive chains one packet may span (64 KiB over the smallest sane buffers).
pub(crate) const MAX_MERGE: usize = 64;

/// Bytes of the Ethernet addresses (destination, source) read with the header to switch.
pub(crate) const MACS: u32 = 12;

/// One packet on its way through: its bytes wherever they are, the virtio-net header first.
#[derive(Debug, Clone, Copy)]
pub struct Pkt<'a> {
    /// The bytes: header, then the Ethernet frame.
    pub segs: &'a [Seg<'a>],
    /// Total length, header included.
    pub len: u32,
    /// Length of the header in front (10 or 12: see [`pvnet_net::hdr_len`]).
    pub hdr_len: u32,
    /// The header, decoded once by the port it came from.
    pub hdr: VnetHdr,
    /// Destination and source Ethernet addresses, read once with the header.
    pub macs: [u8; 12],
    /// The flow hash's high 32 bits (`flow::flow_hash_head`) when the
    /// source knows it without reading the frame (a generator, per flow: as a NIC's RSS hash
    /// or a socket's `sk_txhash` in Linux); 0 when it does not, and the steering computes it.
    pub hash: u32,
    /// Its VLAN inside the switch (the low 12 bits) and whether its frame carries the 802.1Q
    /// tag (`0x8000`): see `switch::vlan`. 0 (VLAN 0, untagged) from every port, except a
    /// trunk between shards, which carries the word across; the switch sets it.
    pub vlan: u16,
}

impl Pkt<'_> {
    /// The Ethernet frame's length.
    #[inline]
    pub(crate) fn frame_len(&self) -> u32 {
        self.len - self.hdr_len
    }

    /// Whether the header carries offload metadata (a checksum to complete, a GSO packet).
    #[inline]
    pub(crate) fn has_offload(&self) -> bool {
        self.hdr.flags != 0 || self.hdr.gso_type != VnetHdr::GSO_NONE
    }
}

/// The state of a packet slot before a source fills it.
pub(crate) const EMPTY: Pkt<'static> = Pkt {
    segs: &[],
    len: 0,
    hdr_len: HDR_LEN,
    hdr: VnetHdr {
        flags: 0,
        gso_type: 0,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
        num_buffers: 0,
    },
    macs: [0; 12],
    hash: 0,
    vlan: 0,
};

/// Reads the header and the addresses behind it from a packet's first bytes: one fixed-size
/// copy when the first segment holds them (nearly always). `None` if the packet is shorter.
#[inline]
pub(crate) fn read_head(segs: &[Seg<'_>], hdr_len: u32) -> Option<(VnetHdr, [u8; 12])> {
    if hdr_len == HDR_LEN {
        head::<{ HDR_LEN as usize }, { HDR_LEN as usize + MACS as usize }>(segs)
    } else {
        head::<{ HDR_LEN_LEGACY as usize }, { HDR_LEN_LEGACY as usize + MACS as usize }>(segs)
    }
}

/// [`read_head`] for an `H`-byte header (`N` = `H` + 12): constant sizes, so every copy is
/// inlined rather than a `memcpy` call.
#[inline(always)]
fn head<const H: usize, const N: usize>(segs: &[Seg<'_>]) -> Option<(VnetHdr, [u8; 12])> {
    let h: [u8; N] = match segs.first().and_then(|s| s.read_array::<N>(0)) {
        Some(a) => a,
        None => {
            let mut h = [0u8; N];
            if !head_split::<H, N>(segs, &mut h) && virtq::read_segs(segs, 0, &mut h) < N {
                return None;
            }
            h
        }
    };
    let mut v1 = [0u8; VnetHdr::LEN];
    v1[..H].copy_from_slice(&h[..H]);
    let hdr = VnetHdr::parse(&v1)?;
    let mut macs = [0u8; 12];
    macs.copy_from_slice(&h[H..]);
    Some((hdr, macs))
}

/// [`head`]'s bytes when the first segment does not hold them all, for the common case: the
/// header alone in the first segment and the frame from the second, the way DPDK's virtio
/// PMD and Linux's virtio_net chain a packet (two fixed-size reads instead of a gather).
/// False if the chain is not so.
#[inline(always)]
fn head_split<const H: usize, const N: usize>(segs: &[Seg<'_>], h: &mut [u8; N]) -> bool {
    let (Some(s0), Some(s1)) = (segs.first(), segs.get(1)) else {
        return false;
    };
    if !u32::try_from(H).is_ok_and(|len| s0.len() == len) {
        return false;
    }
    match (s0.read_array::<H>(0), s1.read_array::<{ MACS as usize }>(0)) {
        (Some(a), Some(m)) => {
            h[..H].copy_from_slice(&a);
            h[H..].copy_from_slice(&m);
            true
        }
        _ => false,
    }
}

/// The high 32 bits of a packet's flow hash (`flow::flow_hash_head`), from its bytes: for a
/// packet whose source did not stamp one ([`Pkt::hash`] 0).
#[inline]
pub(crate) fn flow_hash_of(p: &Pkt<'_>) -> u64 {
    use crate::flow::{flow_hash_head, flow_hash_l2, hashes_l3};
    let first = p.segs.first();
    // A frame without IP hashes its addresses, which the packet carries already: only
    // its EtherType is read.
    let et = first.and_then(|s| s.read_array::<2>(p.hdr_len + 12));
    let h = if et.is_some_and(|e| !hashes_l3(u16::from_be_bytes(e))) {
        flow_hash_l2(p.macs)
    } else {
        // The addresses and ports lie within the frame's first 64 bytes (VLAN and IPv6
        // included): one fixed-size copy when the first segment holds them (nearly always).
        let b = match first.and_then(|s| s.read_array::<64>(p.hdr_len)) {
            Some(b) => b,
            None => {
                let mut b = [0u8; 64];
                virtq::read_segs(p.segs, p.hdr_len, &mut b);
                b
            }
        };
        flow_hash_head(&b, p.frame_len() as usize)
    };
    h >> 32
}

/// What became of one packet offered to a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxOut {
    /// Taken (and counted by the port).
    Sent,
    /// No room now (see [`crate::egress`] for what happens next).
    NoRoom,
    /// Refused for good, for this reason (counted at the sender).
    Dropped(DropReason),
}

/// What of the packets just taken lives in memory the switch reuses before the commit
/// (see `Port::staged`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Staged {
    /// All of each: a completed checksum, a segment, a copy with a tag inserted or removed.
    Whole,
    /// Each one's first segment: a re-cut's new header, addresses and tag; the rest is the
    /// sender's memory, held until the commit.
    Head,
}

/// What a port can take, so the switch can fit packets to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Caps {
    /// Takes packets at all (a generator does not).
    pub receives: bool,
    /// Receive offloads it negotiated (`VIRTIO_NET_F_GUEST_*`): a packet whose metadata it
    /// cannot take is completed or segmented in software first.
    pub offloads: u64,
    /// Its packets cost nothing while they wait for a full receiver (a generator's next
    /// frames are not made yet): they wait in it, however long, rather than in a queue (the
    /// egress's `Offer::Patient`).
    pub patient: bool,
    /// It can send what it receives straight back out of itself (the port's `hairpin`, the
    /// fixed wiring's `Wire::Hairpin`).
    pub hairpin: bool,
}

/// Bytes a frame may carry beyond its MTU: the Ethernet header (14) and one 802.1Q tag (4),
/// as Linux's bridge allows (`is_skb_forwardable`: `mtu + hard_header_len + VLAN_HLEN`).
pub const MTU_OVERHEAD: u32 = 18;

/// Whether `p` may go to a port whose MTU is `mtu`: its frame is no longer than the MTU plus
/// [`MTU_OVERHEAD`], or it is a GSO packet (its segments are cut to the MSS its sender
/// chose, as Linux lets GSO packets through the same check).
#[inline]
pub fn fits_mtu(p: &Pkt<'_>, mtu: u16) -> bool {
    frame_fits_mtu(p.frame_len(), &p.hdr, mtu)
}

/// [`fits_mtu`] of a frame of `frame_len` bytes behind the header `hdr`.
#[inline]
pub fn frame_fits_mtu(frame_len: u32, hdr: &VnetHdr, mtu: u16) -> bool {
    frame_len <= u32::from(mtu) + MTU_OVERHEAD
        || hdr.gso_type & !VnetHdr::GSO_ECN != VnetHdr::GSO_NONE
}

/// The virtio-net header of a packet whose frame grows (`insert`) or shrinks by a tag:
/// `csum_start` (where checksumming starts, from the frame's start) and a GSO packet's
/// `hdr_len` (its headers' length) move by 4 bytes. None if they point into the bytes that
/// go (a header no sender makes).
pub(crate) fn moved(h: &VnetHdr, insert: bool) -> Option<VnetHdr> {
    let mv = |x: u16| {
        if insert {
            x.checked_add(4)
        } else {
            x.checked_sub(4).filter(|&y| y >= 12)
        }
    };
    let mut h = *h;
    if h.flags & VnetHdr::F_NEEDS_CSUM != 0 {
        h.csum_start = mv(h.csum_start)?;
    }
    if h.gso_type != VnetHdr::GSO_NONE && h.hdr_len != 0 {
        h.hdr_len = mv(h.hdr_len)?;
    }
    Some(h)
}

/// Puts back the tag the kernel took out of a frame it handed over (an `AF_PACKET` socket
/// gives it beside the frame, in its auxiliary data): `buf[..len]` is a virtio-net header of
/// `HDR_LEN` bytes, then the frame. The bytes after the frame's addresses move 4 on, the tag
/// (`tpid`, `tci`) goes between, and the header's offsets move with them ([`moved`]).
/// Returns the new length; None if `buf` has no room for it, the frame has no addresses, or
/// the header cannot move (no sender makes such a header).
pub(crate) fn put_back(buf: &mut [u8], len: usize, tpid: u16, tci: u16) -> Option<usize> {
    let hl = HDR_LEN as usize;
    let addrs = hl + MACS as usize;
    let tag = 4;
    if len < addrs || len + tag > buf.len() {
        return None;
    }
    let h = moved(&VnetHdr::parse(&buf[..hl])?, true)?;
    buf.copy_within(addrs..len, addrs + tag);
    buf[addrs..addrs + 2].copy_from_slice(&tpid.to_be_bytes());
    buf[addrs + 2..addrs + tag].copy_from_slice(&tci.to_be_bytes());
    h.write(&mut buf[..hl]);
    Some(len + tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read_head` over a chain whose header sits alone in its segment (how DPDK and Linux chain a
    /// packet: two fixed-size reads), over one whose first segment ends inside the addresses
    /// (gathered), and over one too short to hold them.
    #[test]
    fn a_tag_the_kernel_took_out_goes_back_behind_the_addresses() {
        let hl = HDR_LEN as usize;
        let mut buf = vec![0u8; 200];
        let h = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: VnetHdr::GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 0,
        };
        h.write(&mut buf[..hl]);
        let frame: Vec<u8> = (0..100u8).collect();
        buf[hl..hl + 100].copy_from_slice(&frame);
        let n = put_back(&mut buf, hl + 100, 0x8100, 0x2000 | 10).expect("room");
        assert_eq!(n, hl + 104);
        assert_eq!(&buf[hl..hl + 12], &frame[..12], "the addresses stay");
        assert_eq!(
            &buf[hl + 12..hl + 16],
            &[0x81, 0x00, 0x20, 10],
            "then the tag"
        );
        assert_eq!(&buf[hl + 16..n], &frame[12..], "then the rest");
        let g = VnetHdr::parse(&buf[..hl]).expect("header");
        assert_eq!((g.csum_start, g.hdr_len, g.gso_size), (38, 58, 1448));
        // No room for 4 more bytes, or no addresses: left as it is.
        let mut full = vec![0u8; hl + 100];
        assert_eq!(put_back(&mut full, hl + 100, 0x8100, 10), None);
        assert_eq!(put_back(&mut buf, hl + 6, 0x8100, 10), None);
    }

    #[test]
    fn read_head_takes_the_addresses_from_the_segment_after_the_header() {
        let macs: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let mut hdr = [0u8; HDR_LEN as usize];
        let mut f = [0u8; 64];
        f[..12].copy_from_slice(&macs);
        let segs = [Seg::from_mut(&mut hdr), Seg::from_mut(&mut f)];
        let (_, got) = read_head(&segs, HDR_LEN).expect("header, then the frame");
        assert_eq!(got, macs);
        // The first segment holds the header and 2 bytes of the addresses: gathered across.
        let mut a = [0u8; HDR_LEN as usize + 2];
        a[HDR_LEN as usize..].copy_from_slice(&macs[..2]);
        let mut b = [0u8; 64];
        b[..10].copy_from_slice(&macs[2..]);
        let segs = [Seg::from_mut(&mut a), Seg::from_mut(&mut b)];
        assert_eq!(read_head(&segs, HDR_LEN).map(|h| h.1), Some(macs));
        // A header and 11 bytes: not a frame.
        let mut hdr = [0u8; HDR_LEN as usize];
        let mut short = [0u8; 11];
        let segs = [Seg::from_mut(&mut hdr), Seg::from_mut(&mut short)];
        assert!(read_head(&segs, HDR_LEN).is_none());
    }
}
