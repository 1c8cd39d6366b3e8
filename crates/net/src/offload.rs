//! Software fallbacks for virtio-net transmit offloads: checksum completion and GSO.
//!
//! A driver that negotiated `VIRTIO_NET_F_CSUM` / `VIRTIO_NET_F_HOST_TSO4` / `_TSO6` /
//! `_HOST_USO` may hand the device packets whose `virtio_net_hdr` says "the checksum still has
//! to be finished" (`VIRTIO_NET_HDR_F_NEEDS_CSUM`, with `csum_start` / `csum_offset`) or "this is
//! one large TCP or UDP packet to cut into `gso_size` pieces" (`gso_type`, `gso_size`); see the
//! virtio 1.x specification, 5.1.6.2 "Packet Transmission", and the header layout of Linux
//! `include/uapi/linux/virtio_net.h`. When such a packet is switched to a port whose driver did
//! not negotiate the matching receive offloads (`VIRTIO_NET_F_GUEST_CSUM`, `_GUEST_TSO4`, ...),
//! 5.1.6.4 "Processing of Incoming Packets" requires the device to hand over `flags` = 0 and
//! `gso_type` = `VIRTIO_NET_HDR_GSO_NONE`, with fully checksummed packets. This module does
//! that work in software:
//!
//! * [`complete_csum`]: finish a partial checksum in place, as Linux `skb_checksum_help` does.
//! * [`segment`]: cut a TCPv4 / TCPv6 (TSO) or UDP (USO) GSO packet into MSS-sized frames, with
//!   the header fix-ups of Linux `tcp_gso_segment` / `__udp_gso_segment` (lengths, IPv4 id and
//!   header checksum, TCP sequence numbers and flags, full L4 checksums).
//!
//! Everything here parses untrusted guest memory: every offset is checked, nothing panics, and
//! errors come back as [`OffloadError`]. [`segment`] copies each segment once into a caller-owned
//! scratch buffer, so it does not allocate once that buffer has grown to the largest segment.

#![forbid(unsafe_code)]

use thiserror::Error;

pub use crate::hdr::{
    VnetHdr, F_DATA_VALID, F_NEEDS_CSUM, GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6, GSO_UDP,
    GSO_UDP_L4,
};

/// Largest IP packet [`segment`] accepts: the IPv4 total length, or the IPv6 payload length,
/// must fit in 16 bits (no IPv6 jumbograms, no Linux "BIG TCP").
pub const MAX_GSO_LEN: usize = 0xffff;

/// Why a packet could not be checksummed or segmented. No output was produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum OffloadError {
    /// A header runs past the end of the frame (or, for TCP/UDP, past the IP packet).
    #[error("truncated {layer} header: needs {need} bytes, only {have} available")]
    Truncated {
        /// Which header.
        layer: &'static str,
        /// Bytes (from the start of the frame) the header needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The Ethernet payload is neither IPv4 nor IPv6 (after at most one VLAN tag).
    #[error("unsupported EtherType {0:#06x}: only IPv4 and IPv6, behind at most one VLAN tag")]
    UnsupportedEtherType(u16),
    /// The IP payload is neither TCP nor UDP (IPv6 extension headers land here too).
    #[error("unsupported IP protocol {0}: only TCP and UDP, without IPv6 extension headers")]
    UnsupportedProtocol(u8),
    /// `gso_type` is not one [`segment`] implements.
    #[error("unsupported GSO type {0:#04x}: only TCPV4, TCPV6 (with or without ECN) and UDP_L4")]
    UnsupportedGsoType(u8),
    /// `gso_type` names a different protocol than the packet carries.
    #[error("GSO type {gso_type:#04x} does not match the packet, which is {packet}")]
    GsoTypeMismatch {
        /// The header's `gso_type`.
        gso_type: u8,
        /// What the packet actually is, e.g. "IPv6/TCP".
        packet: &'static str,
    },
    /// `gso_size` is 0.
    #[error("gso_size is 0")]
    ZeroGsoSize,
    /// The IP packet is larger than [`MAX_GSO_LEN`].
    #[error("IP packet of {0} bytes exceeds the 64 KiB limit of GSO")]
    TooLarge(usize),
    /// A header field is malformed (bad version, IHL or TCP data offset).
    #[error("malformed header: {0}")]
    Malformed(&'static str),
    /// The IPv4 packet is a fragment, which cannot be segmented.
    #[error("IPv4 fragment (MF set or nonzero fragment offset) cannot be segmented")]
    Fragment,
    /// The IP length field claims more bytes than the frame carries.
    #[error("IP length field says {claimed} bytes, the frame carries {have}")]
    IpLength {
        /// Bytes after the IP header start (IPv4) or after the fixed IPv6 header the field claims.
        claimed: usize,
        /// Bytes the frame has there.
        have: usize,
    },
    /// `hdr_len` points past the end of the frame.
    #[error("hdr_len {hdr_len} is beyond the {len}-byte frame")]
    HdrLenOutOfRange {
        /// The header's `hdr_len`.
        hdr_len: u16,
        /// Frame length.
        len: usize,
    },
    /// The checksum field named by `csum_start` + `csum_offset` is not inside the frame.
    #[error("checksum field at csum_start {start} + csum_offset {offset} is beyond the {len}-byte frame")]
    CsumOutOfRange {
        /// `csum_start`.
        start: u16,
        /// `csum_offset`.
        offset: u16,
        /// Frame length.
        len: usize,
    },
}

/// Completes a partial checksum in place, as Linux `skb_checksum_help` does for
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM` (virtio 1.x, 5.1.6.2): the 16-bit field at
/// `csum_start + csum_offset` already holds the pseudo-header sum; the ones' complement of the
/// ones' complement sum of `frame[csum_start..]` (that field included) is stored there, big
/// endian. The result is stored as is, also when it is 0 (UDP's "0 means 0xffff" is left to the
/// sender, which folds it into the pseudo-header sum, as Linux does).
///
/// `frame` is the Ethernet frame without the virtio-net header. Afterwards the caller clears
/// `F_NEEDS_CSUM` in the header it hands on.
///
/// # Errors
///
/// [`OffloadError::CsumOutOfRange`] if the 2-byte field is not inside `frame`; `frame` is then
/// left untouched.
pub fn complete_csum(
    frame: &mut [u8],
    csum_start: u16,
    csum_offset: u16,
) -> Result<(), OffloadError> {
    let start = usize::from(csum_start);
    let field = start + usize::from(csum_offset);
    if field + 2 > frame.len() {
        return Err(OffloadError::CsumOutOfRange {
            start: csum_start,
            offset: csum_offset,
            len: frame.len(),
        });
    }
    let csum = !fold(sum_be(&frame[start..]));
    put16(frame, field, csum);
    Ok(())
}

/// Software GSO (virtio 1.x, 5.1.6.2 and 5.1.6.4): cuts the GSO packet `frame` (an Ethernet
/// frame without the virtio-net header) described by `hdr` into segments of `hdr.gso_size`
/// payload bytes (the last one shorter) and hands each one to `out` as a complete Ethernet
/// frame. Returns the number of segments; a packet whose payload fits in one segment (or is
/// empty) yields one segment, with its headers and checksums completed all the same.
///
/// Supported: `GSO_TCPV4`, `GSO_TCPV6` (with or without `GSO_ECN`) and `GSO_UDP_L4` (IPv4 or
/// IPv6), over Ethernet with at most one 802.1Q / 802.1ad tag, IPv4 with options, IPv6 without
/// extension headers, TCP with options. The headers are parsed from the frame; `hdr.hdr_len` is
/// only checked to lie inside the frame, and `csum_start` / `csum_offset` / `flags` are not
/// used (every checksum is computed in full, the incoming ones are ignored). A nonzero IP length
/// field shorter than the frame trims trailing padding; a zero one means "the rest of the frame".
///
/// Each segment has: the IPv4 total length (or IPv6 payload length) of its own size; the IPv4
/// id of the original plus its index (wrapping), and a fresh IPv4 header checksum; for TCP the
/// sequence number advanced by the payload before it, FIN and PSH only on the last segment,
/// CWR only on the first; for UDP its own length; a full TCP/UDP checksum (UDP 0 sent as
/// 0xffff). Every other header byte is copied as is.
///
/// `scratch` is reused for every segment; it is cleared here and grows to the largest segment
/// (headers plus `gso_size`), so no allocation happens once it has grown. Everything is
/// validated before the first call to `out`: on error nothing was emitted.
///
/// # Errors
///
/// An unsupported `gso_type` (`GSO_NONE`, `GSO_UDP`, `GSO_UDP_L4` with `GSO_ECN`, unknown
/// values), a `gso_type` that does not match the packet, `gso_size` 0, `hdr_len` past the
/// frame, truncated or malformed headers, an L3/L4 protocol other than IPv4/IPv6 and TCP/UDP,
/// IPv4 fragments, and IP packets over [`MAX_GSO_LEN`]. See [`OffloadError`].
pub fn segment(
    hdr: &VnetHdr,
    frame: &[u8],
    scratch: &mut Vec<u8>,
    mut out: impl FnMut(&mut [u8]),
) -> Result<usize, OffloadError> {
    segment_while(hdr, frame, scratch, |s| {
        out(s);
        true
    })
}

/// [`segment`], stopping as soon as `out` returns false (the receiver has no room: the rest
/// is not computed). Returns how many segments were handed to `out`.
///
/// # Errors
///
/// As [`segment`].
pub fn segment_while(
    hdr: &VnetHdr,
    frame: &[u8],
    scratch: &mut Vec<u8>,
    mut out: impl FnMut(&mut [u8]) -> bool,
) -> Result<usize, OffloadError> {
    let lay = gso_layout(hdr, frame)?;
    let gso = usize::from(hdr.gso_size);
    let payload = &frame[lay.payload..lay.end];
    // Layout::parse bounds the whole packet; check the largest segment's length fields here
    // anyway, so that the conversions in the loop cannot fail after the first `out` call.
    let biggest =
        lay.payload - lay.l4 + gso.min(payload.len()) + if lay.v4 { lay.l4 - lay.l3 } else { 0 };
    if biggest > MAX_GSO_LEN {
        return Err(OffloadError::TooLarge(biggest));
    }
    let mut heads = SegHeaders::new(frame, lay);

    scratch.clear();
    scratch.extend_from_slice(&frame[..lay.payload]);
    let mut off = 0usize;
    let mut count = 0usize;
    loop {
        let n = gso.min(payload.len() - off);
        let last = off + n == payload.len();
        scratch.truncate(lay.payload);
        scratch.extend_from_slice(&payload[off..off + n]);
        heads.write(scratch, off, n, last)?;

        let more = out(scratch);
        count += 1;
        off += n;
        if last || !more {
            return Ok(count);
        }
    }
}

/// The layout of a frame [`segment_while`] is asked to segment, once `hdr` and the frame's
/// headers are checked against each other.
fn gso_layout(hdr: &VnetHdr, frame: &[u8]) -> Result<Layout, OffloadError> {
    let want_tcp_v4 = match hdr.gso_type & !GSO_ECN {
        GSO_TCPV4 => Some((true, Some(true))),
        GSO_TCPV6 => Some((true, Some(false))),
        GSO_UDP_L4 if hdr.gso_type & GSO_ECN == 0 => Some((false, None)),
        _ => None,
    };
    let Some((want_tcp, want_v4)) = want_tcp_v4 else {
        return Err(OffloadError::UnsupportedGsoType(hdr.gso_type));
    };
    if hdr.gso_size == 0 {
        return Err(OffloadError::ZeroGsoSize);
    }
    if usize::from(hdr.hdr_len) > frame.len() {
        return Err(OffloadError::HdrLenOutOfRange {
            hdr_len: hdr.hdr_len,
            len: frame.len(),
        });
    }
    let lay = Layout::parse(frame)?;
    if lay.tcp != want_tcp || want_v4.is_some_and(|v4| v4 != lay.v4) {
        return Err(OffloadError::GsoTypeMismatch {
            gso_type: hdr.gso_type,
            packet: lay.name(),
        });
    }
    Ok(lay)
}

/// What each segment's headers are computed from: the original's, read once.
struct SegHeaders {
    lay: Layout,
    /// Addresses and protocol of the pseudo-header; each segment adds its L4 length.
    pseudo: u64,
    /// The next segment's IPv4 id.
    ip_id: u16,
    /// The original's TCP sequence number and flags.
    seq0: u32,
    tcp_flags: u8,
}

impl SegHeaders {
    fn new(frame: &[u8], lay: Layout) -> Self {
        let pseudo = if lay.v4 {
            sum_be(&frame[lay.l3 + 12..lay.l3 + 20])
        } else {
            sum_be(&frame[lay.l3 + 8..lay.l3 + 40])
        } + u64::from(if lay.tcp { IPPROTO_TCP } else { IPPROTO_UDP });
        SegHeaders {
            lay,
            pseudo,
            ip_id: if lay.v4 { get16(frame, lay.l3 + 4) } else { 0 },
            seq0: if lay.tcp { get32(frame, lay.l4 + 4) } else { 0 },
            tcp_flags: if lay.tcp { frame[lay.l4 + 13] } else { 0 },
        }
    }

    /// Fixes the headers in `scratch` (the original's, then `n` payload bytes from `off`)
    /// for that segment: lengths, IPv4 id and checksum, TCP sequence and flags, L4 checksum.
    #[inline]
    fn write(
        &mut self,
        scratch: &mut [u8],
        off: usize,
        n: usize,
        last: bool,
    ) -> Result<(), OffloadError> {
        let lay = self.lay;
        let l3_hdr_len = lay.l4 - lay.l3;
        let l4_hdr_len = lay.payload - lay.l4;
        // Cannot fail: checked against `biggest` in `segment_while`.
        let l4_len =
            u16::try_from(l4_hdr_len + n).map_err(|_| OffloadError::TooLarge(l4_hdr_len + n))?;
        if lay.v4 {
            let tot = u16::try_from(l3_hdr_len + n + l4_hdr_len)
                .map_err(|_| OffloadError::TooLarge(l3_hdr_len + l4_hdr_len + n))?;
            put16(scratch, lay.l3 + 2, tot);
            put16(scratch, lay.l3 + 4, self.ip_id);
            put16(scratch, lay.l3 + 10, 0);
            let c = !fold(sum_be(&scratch[lay.l3..lay.l4]));
            put16(scratch, lay.l3 + 10, c);
            self.ip_id = self.ip_id.wrapping_add(1);
        } else {
            put16(scratch, lay.l3 + 4, l4_len);
        }

        let sum_field = if lay.tcp {
            let adv = u32::try_from(off).map_err(|_| OffloadError::TooLarge(off))?;
            put32(scratch, lay.l4 + 4, self.seq0.wrapping_add(adv));
            let mut f = self.tcp_flags;
            if off != 0 {
                f &= !TCP_CWR;
            }
            if !last {
                f &= !(TCP_FIN | TCP_PSH);
            }
            scratch[lay.l4 + 13] = f;
            lay.l4 + 16
        } else {
            put16(scratch, lay.l4 + 4, l4_len);
            lay.l4 + 6
        };
        put16(scratch, sum_field, 0);
        let mut c = !fold(self.pseudo + u64::from(l4_len) + sum_be(&scratch[lay.l4..]));
        if c == 0 && !lay.tcp {
            // RFC 768: a computed 0 is sent as all ones (0 means "no checksum").
            c = 0xffff;
        }
        put16(scratch, sum_field, c);
        Ok(())
    }
}

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;
const IPV4_MIN_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const TCP_MIN_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Where the headers of a checked packet are; every offset is within the frame and
/// `l3 < l4 < payload <= end <= frame.len()`.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Start of the IP header.
    l3: usize,
    /// Start of the TCP/UDP header.
    l4: usize,
    /// Start of the payload.
    payload: usize,
    /// End of the IP packet (the frame may carry padding after it).
    end: usize,
    v4: bool,
    tcp: bool,
}

impl Layout {
    fn parse(frame: &[u8]) -> Result<Self, OffloadError> {
        need(frame.len(), ETH_HLEN, "Ethernet")?;
        let mut ethertype = get16(frame, 12);
        let mut l3 = ETH_HLEN;
        if ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ {
            l3 += VLAN_HLEN;
            need(frame.len(), l3, "VLAN")?;
            ethertype = get16(frame, l3 - 2);
        }

        let (v4, proto, l4, end) = match ethertype {
            ETHERTYPE_IPV4 => {
                need(frame.len(), l3 + IPV4_MIN_HLEN, "IPv4")?;
                if frame[l3] >> 4 != 4 {
                    return Err(OffloadError::Malformed("IPv4 version field is not 4"));
                }
                let ihl = usize::from(frame[l3] & 0xf) * 4;
                if ihl < IPV4_MIN_HLEN {
                    return Err(OffloadError::Malformed("IPv4 IHL is below 5"));
                }
                need(frame.len(), l3 + ihl, "IPv4 options")?;
                if get16(frame, l3 + 6) & 0x3fff != 0 {
                    return Err(OffloadError::Fragment);
                }
                let have = frame.len() - l3;
                let end = match usize::from(get16(frame, l3 + 2)) {
                    0 if have > MAX_GSO_LEN => return Err(OffloadError::TooLarge(have)),
                    0 => frame.len(),
                    tot if tot > have => return Err(OffloadError::IpLength { claimed: tot, have }),
                    tot if tot < ihl => {
                        return Err(OffloadError::Malformed("IPv4 total length is below IHL"))
                    }
                    tot => l3 + tot,
                };
                (true, frame[l3 + 9], l3 + ihl, end)
            }
            ETHERTYPE_IPV6 => {
                need(frame.len(), l3 + IPV6_HLEN, "IPv6")?;
                if frame[l3] >> 4 != 6 {
                    return Err(OffloadError::Malformed("IPv6 version field is not 6"));
                }
                let have = frame.len() - l3 - IPV6_HLEN;
                let end = match usize::from(get16(frame, l3 + 4)) {
                    0 if have > MAX_GSO_LEN => return Err(OffloadError::TooLarge(have)),
                    0 => frame.len(),
                    plen if plen > have => {
                        return Err(OffloadError::IpLength {
                            claimed: plen,
                            have,
                        })
                    }
                    plen => l3 + IPV6_HLEN + plen,
                };
                (false, frame[l3 + 6], l3 + IPV6_HLEN, end)
            }
            other => return Err(OffloadError::UnsupportedEtherType(other)),
        };

        let (tcp, payload) = match proto {
            IPPROTO_TCP => {
                need(end, l4 + TCP_MIN_HLEN, "TCP")?;
                let doff = usize::from(frame[l4 + 12] >> 4) * 4;
                if doff < TCP_MIN_HLEN {
                    return Err(OffloadError::Malformed("TCP data offset is below 5"));
                }
                need(end, l4 + doff, "TCP options")?;
                (true, l4 + doff)
            }
            IPPROTO_UDP => {
                need(end, l4 + UDP_HLEN, "UDP")?;
                (false, l4 + UDP_HLEN)
            }
            other => return Err(OffloadError::UnsupportedProtocol(other)),
        };
        Ok(Self {
            l3,
            l4,
            payload,
            end,
            v4,
            tcp,
        })
    }

    fn name(&self) -> &'static str {
        match (self.v4, self.tcp) {
            (true, true) => "IPv4/TCP",
            (true, false) => "IPv4/UDP",
            (false, true) => "IPv6/TCP",
            (false, false) => "IPv6/UDP",
        }
    }
}

/// `Ok` if `need` bytes are available.
fn need(have: usize, need: usize, layer: &'static str) -> Result<(), OffloadError> {
    if need > have {
        Err(OffloadError::Truncated { layer, need, have })
    } else {
        Ok(())
    }
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// The ones' complement sum (RFC 1071) of `data` read as big-endian 16-bit words, an odd last
/// byte padded with a zero, reduced to at most 32 bits but not yet folded to 16. Sums of pieces
/// that start at even offsets may be added together as `u64` (up to 2^32 of them) before
/// [`fold`].
pub(crate) fn sum_be(data: &[u8]) -> u64 {
    // 64-bit words with end-around carry: folding to 16 bits later gives the same result as
    // adding 16-bit words, since 2^16, 2^32 and 2^48 are all 1 modulo 0xffff.
    let mut acc = 0u64;
    let mut add = |w: u64| {
        let (s, carry) = acc.overflowing_add(w);
        acc = s + u64::from(carry);
    };
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        add(u64::from_be_bytes(w));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        add(u64::from_be_bytes(w));
    }
    // Reduce to 32 bits so that callers can add a few sums without overflowing.
    let acc = (acc & 0xffff_ffff) + (acc >> 32); // < 2^33
    (acc & 0xffff_ffff) + (acc >> 32)
}

/// Folds a ones' complement sum to 16 bits (not complemented).
pub(crate) fn fold(sum: u64) -> u16 {
    let s = (sum & 0xffff_ffff) + (sum >> 32); // < 2^33
    let s = (s & 0xffff_ffff) + (s >> 32); // < 2^32
    let s = (s & 0xffff) + (s >> 16); // < 2^17
    let s = (s & 0xffff) + (s >> 16); // <= 0xffff
    let [.., hi, lo] = s.to_be_bytes();
    u16::from_be_bytes([hi, lo])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Independent reference: the Internet checksum of the concatenation of `parts`, 16-bit
    /// words one at a time, the plain textbook way.
    fn ref_csum(parts: &[&[u8]]) -> u16 {
        let bytes: Vec<u8> = parts.concat();
        let mut sum: u32 = 0;
        for pair in bytes.chunks(2) {
            let hi = u32::from(pair[0]) << 8;
            let lo = pair.get(1).map_or(0, |&b| u32::from(b));
            sum += hi | lo;
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
        }
        !u16::try_from(sum).unwrap()
    }

    /// Tiny deterministic PRNG for payload bytes (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next().to_be_bytes()[0]).collect()
        }
    }

    /// What to build.
    #[derive(Debug, Clone)]
    struct Spec {
        vlan: Option<u16>,
        v6: bool,
        udp: bool,
        /// IPv4 option bytes (multiple of 4, at most 40).
        ip_opts: usize,
        /// TCP option bytes (multiple of 4, at most 40).
        tcp_opts: usize,
        tcp_flags: u8,
        seq: u32,
        ip_id: u16,
        payload: Vec<u8>,
    }

    impl Spec {
        fn tcp4(payload: Vec<u8>) -> Self {
            Self {
                vlan: None,
                v6: false,
                udp: false,
                ip_opts: 0,
                tcp_opts: 12,
                tcp_flags: 0x18, // PSH|ACK
                seq: 0xfffe_0000,
                ip_id: 0xfffd,
                payload,
            }
        }
        fn l2(&self) -> usize {
            14 + if self.vlan.is_some() { 4 } else { 0 }
        }
        fn l3_len(&self) -> usize {
            if self.v6 {
                40
            } else {
                20 + self.ip_opts
            }
        }
        fn l4_len(&self) -> usize {
            if self.udp {
                8
            } else {
                20 + self.tcp_opts
            }
        }
        fn hdrs(&self) -> usize {
            self.l2() + self.l3_len() + self.l4_len()
        }
        fn gso_type(&self) -> u8 {
            match (self.udp, self.v6) {
                (true, _) => GSO_UDP_L4,
                (false, false) => GSO_TCPV4,
                (false, true) => GSO_TCPV6,
            }
        }
        fn vnet(&self, gso_size: u16) -> VnetHdr {
            let l4 = self.l2() + self.l3_len();
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: self.gso_type(),
                hdr_len: u16::try_from(self.hdrs()).unwrap(),
                gso_size,
                csum_start: u16::try_from(l4).unwrap(),
                csum_offset: if self.udp { 6 } else { 16 },
                num_buffers: 0,
            }
        }

        /// The frame, with the L4 checksum field holding the pseudo-header sum, as a Linux
        /// guest leaves it for `F_NEEDS_CSUM` (so `complete_csum` can be tested on it too).
        fn build(&self) -> Vec<u8> {
            let mut f = vec![0x02, 0, 0, 0, 0, 0xbb, 0x02, 0, 0, 0, 0, 0xaa];
            if let Some(tci) = self.vlan {
                f.extend_from_slice(&0x8100u16.to_be_bytes());
                f.extend_from_slice(&tci.to_be_bytes());
            }
            let ethertype: u16 = if self.v6 { 0x86dd } else { 0x0800 };
            f.extend_from_slice(&ethertype.to_be_bytes());
            let l4_total = self.l4_len() + self.payload.len();
            let proto = if self.udp { 17 } else { 6 };
            if self.v6 {
                f.extend_from_slice(&0x6012_3456u32.to_be_bytes());
                f.extend_from_slice(&u16::try_from(l4_total).unwrap().to_be_bytes());
                f.push(proto);
                f.push(64);
                let src: Vec<u8> = (0..16u8).map(|i| 0x20 + i).collect();
                let dst: Vec<u8> = (0..16u8).map(|i| 0xf0 - i).collect();
                f.extend_from_slice(&src);
                f.extend_from_slice(&dst);
            } else {
                let ihl = u8::try_from(self.l3_len() / 4).unwrap();
                f.push(0x40 | ihl);
                f.push(0xb8); // DSCP EF, ECN 0
                f.extend_from_slice(
                    &u16::try_from(self.l3_len() + l4_total)
                        .unwrap()
                        .to_be_bytes(),
                );
                f.extend_from_slice(&self.ip_id.to_be_bytes());
                f.extend_from_slice(&0x4000u16.to_be_bytes()); // DF
                f.push(64);
                f.push(proto);
                f.extend_from_slice(&[0xde, 0xad]); // garbage header checksum
                f.extend_from_slice(&[10, 0, 0, 1, 192, 168, 7, 200]);
                // Options: NOPs then an end-of-list-shaped filler (content does not matter).
                f.extend((0..self.ip_opts).map(|i| if i + 1 == self.ip_opts { 0 } else { 1 }));
            }
            let l4 = f.len();
            if self.udp {
                f.extend_from_slice(&[0x30, 0x39, 0x00, 0x35]);
                f.extend_from_slice(&u16::try_from(l4_total).unwrap().to_be_bytes());
                f.extend_from_slice(&[0, 0]);
            } else {
                f.extend_from_slice(&[0xc0, 0x01, 0x01, 0xbb]);
                f.extend_from_slice(&self.seq.to_be_bytes());
                f.extend_from_slice(&0x1234_5678u32.to_be_bytes());
                let doff = u8::try_from(self.l4_len() / 4).unwrap();
                f.push(doff << 4);
                f.push(self.tcp_flags);
                f.extend_from_slice(&[0xff, 0x00, 0, 0, 0, 0]); // window, csum, urg
                f.extend((0..self.tcp_opts).map(|i| u8::try_from(i % 3 + 1).unwrap()));
            }
            f.extend_from_slice(&self.payload);
            // Partial checksum: the uncomplemented folded pseudo-header sum.
            let field = l4 + if self.udp { 6 } else { 16 };
            let p = !ref_csum(&[&self.pseudo(&f, l4_total)]);
            f[field..field + 2].copy_from_slice(&p.to_be_bytes());
            f
        }

        fn pseudo(&self, seg: &[u8], l4_len: usize) -> Vec<u8> {
            let l3 = self.l2();
            let proto = if self.udp { 17 } else { 6 };
            if self.v6 {
                [
                    &seg[l3 + 8..l3 + 40],
                    &u32::try_from(l4_len).unwrap().to_be_bytes()[..],
                    &[0, 0, 0, proto],
                ]
                .concat()
            } else {
                [
                    &seg[l3 + 12..l3 + 20],
                    &[0, proto],
                    &u16::try_from(l4_len).unwrap().to_be_bytes()[..],
                ]
                .concat()
            }
        }
    }

    fn be16(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// Segments `spec`'s packet with `gso` and checks every invariant against independently
    /// computed values; returns the segment count.
    fn check(spec: &Spec, gso: u16) -> usize {
        let frame = spec.build();
        let hdr = spec.vnet(gso);
        let mut scratch = Vec::new();
        let mut segs: Vec<Vec<u8>> = Vec::new();
        let n = segment(&hdr, &frame, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        assert_eq!(n, segs.len());
        let g = usize::from(gso);
        let plen = spec.payload.len();
        let expect_n = if plen == 0 { 1 } else { plen.div_ceil(g) };
        assert_eq!(n, expect_n, "segment count");

        let (l3, l4, pay) = (spec.l2(), spec.l2() + spec.l3_len(), spec.hdrs());
        let mut joined = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let first = i == 0;
            let last = i + 1 == n;
            let seg_pay = &seg[pay..];
            if last {
                assert_eq!(seg_pay.len(), plen - g * i, "last payload size");
            } else {
                assert_eq!(seg_pay.len(), g, "payload size");
            }
            joined.extend_from_slice(seg_pay);
            // L2 untouched.
            assert_eq!(seg[..l3], frame[..l3]);
            let l4_len = seg.len() - l4;
            if spec.v6 {
                assert_eq!(
                    usize::from(be16(seg, l3 + 4)),
                    l4_len,
                    "IPv6 payload length"
                );
                assert_eq!(seg[l3..l3 + 4], frame[l3..l3 + 4]);
                assert_eq!(seg[l3 + 6..l4], frame[l3 + 6..l4]);
            } else {
                assert_eq!(
                    usize::from(be16(seg, l3 + 2)),
                    seg.len() - l3,
                    "IPv4 total length"
                );
                let id = spec.ip_id.wrapping_add(u16::try_from(i % 65536).unwrap());
                assert_eq!(be16(seg, l3 + 4), id, "IPv4 id");
                assert_eq!(ref_csum(&[&seg[l3..l4]]), 0, "IPv4 header checksum");
                let mut zeroed = seg[l3..l4].to_vec();
                zeroed[10] = 0;
                zeroed[11] = 0;
                assert_eq!(be16(seg, l3 + 10), ref_csum(&[&zeroed]));
                assert_eq!(seg[l3..l3 + 2], frame[l3..l3 + 2]);
                assert_eq!(seg[l3 + 6..l3 + 10], frame[l3 + 6..l3 + 10]);
                assert_eq!(seg[l3 + 12..l4], frame[l3 + 12..l4]);
            }
            let pseudo = spec.pseudo(seg, l4_len);
            assert_eq!(ref_csum(&[&pseudo, &seg[l4..]]), 0, "L4 checksum verifies");
            if spec.udp {
                assert_eq!(usize::from(be16(seg, l4 + 4)), l4_len, "UDP length");
                assert_ne!(
                    be16(seg, l4 + 6),
                    0,
                    "UDP checksum 0 must be sent as 0xffff"
                );
                let mut zeroed = seg[l4..].to_vec();
                zeroed[6] = 0;
                zeroed[7] = 0;
                let expect = match ref_csum(&[&pseudo, &zeroed]) {
                    0 => 0xffff,
                    c => c,
                };
                assert_eq!(be16(seg, l4 + 6), expect);
                assert_eq!(seg[l4..l4 + 4], frame[l4..l4 + 4]);
            } else {
                let seq = spec.seq.wrapping_add(u32::try_from(g * i).unwrap());
                assert_eq!(be32(seg, l4 + 4), seq, "TCP seq");
                let mut flags = spec.tcp_flags;
                if !first {
                    flags &= !0x80;
                }
                if !last {
                    flags &= !0x09;
                }
                assert_eq!(seg[l4 + 13], flags, "TCP flags of segment {i}");
                let mut zeroed = seg[l4..].to_vec();
                zeroed[16] = 0;
                zeroed[17] = 0;
                assert_eq!(be16(seg, l4 + 16), ref_csum(&[&pseudo, &zeroed]));
                assert_eq!(seg[l4..l4 + 4], frame[l4..l4 + 4]);
                assert_eq!(seg[l4 + 8..l4 + 13], frame[l4 + 8..l4 + 13]);
                assert_eq!(seg[l4 + 14..l4 + 16], frame[l4 + 14..l4 + 16]);
                assert_eq!(seg[l4 + 18..pay], frame[l4 + 18..pay]);
            }
        }
        assert_eq!(joined, spec.payload, "concatenated payloads");
        n
    }

    fn sizes(plen: usize) -> Vec<u16> {
        let mut v = vec![1, 7, 536, 1448, 1460, 8948];
        v.push(u16::try_from(plen.max(1)).unwrap());
        v.push(u16::try_from(plen + 1).unwrap());
        v
    }

    /// `check` at every gso_size of [`sizes`]; size 1 only for packets up to 5000 bytes (the
    /// larger ones are covered by the smaller packets, and it saves time).
    fn check_sizes(spec: &Spec, plen: usize) {
        for g in sizes(plen) {
            if g == 1 && plen > 5000 {
                continue;
            }
            check(spec, g);
        }
    }

    #[test]
    fn vnet_hdr_round_trip() {
        let h = VnetHdr {
            flags: 1,
            gso_type: 0x84,
            hdr_len: 0x1234,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 0xbeef,
        };
        let mut b = [0xffu8; 13];
        h.write(&mut b);
        assert_eq!(
            b[..12],
            [1, 0x84, 0x34, 0x12, 0xa8, 0x05, 34, 0, 16, 0, 0xef, 0xbe]
        );
        assert_eq!(b[12], 0xff);
        assert_eq!(VnetHdr::parse(&b), Some(h));
        assert_eq!(VnetHdr::parse(&b[..11]), None);
        assert_eq!(VnetHdr::parse(&[]), None);
    }

    #[test]
    fn checksum_helpers_match_reference() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for len in 0..300 {
            let d = rng.bytes(len);
            assert_eq!(!fold(sum_be(&d)), ref_csum(&[&d]), "len {len}");
        }
        let ones = vec![0xffu8; 70_000];
        assert_eq!(!fold(sum_be(&ones)), ref_csum(&[&ones]));
        // Partial sums of big all-ones pieces added together must not lose a carry.
        let pieces: Vec<u64> = [&ones[..], &ones[..8], &ones[..64]]
            .iter()
            .map(|p| sum_be(p))
            .collect();
        assert_eq!(
            !fold(pieces.iter().sum()),
            ref_csum(&[&ones, &ones[..8], &ones[..64]])
        );
        assert!(pieces.iter().all(|&p| p <= 0xffff_ffff));
        assert_eq!(fold(u64::MAX), 0xffff);
        assert_eq!(fold(0), 0);
    }

    #[test]
    fn tcp4_segments() {
        let mut rng = Rng(1);
        for plen in [0, 1, 2, 999, 1448, 1449, 4000, 65_535 - 20 - 32] {
            let spec = Spec::tcp4(rng.bytes(plen));
            check_sizes(&spec, plen);
        }
    }

    #[test]
    fn tcp4_flags_options_and_vlan() {
        let mut rng = Rng(2);
        let base = Spec::tcp4(rng.bytes(3001));
        for (vlan, ip_opts, tcp_opts, flags) in [
            (None, 0, 0, 0xff),
            (Some(0x0064), 0, 12, 0x99), // CWR|PSH|FIN|ACK behind a VLAN tag
            (Some(0xe00a), 40, 40, 0x19),
            (None, 4, 0, 0x80),
        ] {
            let spec = Spec {
                vlan,
                ip_opts,
                tcp_opts,
                tcp_flags: flags,
                ..base.clone()
            };
            for g in [1, 1000, 1500, 3000, 3001, 3002] {
                check(&spec, g);
            }
            let mut ecn = spec.vnet(1000);
            ecn.gso_type |= GSO_ECN;
            let frame = spec.build();
            let mut scratch = Vec::new();
            let mut cwr = Vec::new();
            let n = segment(&ecn, &frame, &mut scratch, |s| {
                cwr.push(s[spec.l2() + spec.l3_len() + 13] & 0x80 != 0)
            })
            .unwrap();
            assert_eq!(n, 4);
            assert_eq!(cwr, [flags & 0x80 != 0, false, false, false]);
        }
    }

    #[test]
    fn tcp6_segments() {
        let mut rng = Rng(3);
        for plen in [0, 1, 1440, 5000, 65_535 - 20] {
            for vlan in [None, Some(7)] {
                let spec = Spec {
                    v6: true,
                    vlan,
                    tcp_opts: 0,
                    tcp_flags: 0x99,
                    ..Spec::tcp4(rng.bytes(plen))
                };
                check_sizes(&spec, plen);
            }
        }
    }

    #[test]
    fn udp_segments() {
        let mut rng = Rng(4);
        for plen in [0, 1, 1472, 1473, 9000, 65_535 - 28 - 8] {
            for (v6, vlan) in [(false, None), (false, Some(3)), (true, None)] {
                let spec = Spec {
                    udp: true,
                    v6,
                    vlan,
                    ip_opts: 8,
                    ..Spec::tcp4(rng.bytes(plen))
                };
                check_sizes(&spec, plen);
            }
        }
    }

    #[test]
    fn udp_zero_checksum_is_sent_as_ffff() {
        // Search for a payload whose segment checksum comes out 0 and check it is sent as ffff
        // (check() verifies that; this makes sure the case is actually hit).
        let mut spec = Spec {
            udp: true,
            ..Spec::tcp4(vec![0; 2])
        };
        let mut hit = false;
        for v in 0..=u16::MAX {
            spec.payload = v.to_be_bytes().to_vec();
            let frame = spec.build();
            let l4 = spec.l2() + spec.l3_len();
            let mut zeroed = frame[l4..].to_vec();
            zeroed[6] = 0;
            zeroed[7] = 0;
            let len = frame.len() - l4;
            if ref_csum(&[&spec.pseudo(&frame, len), &zeroed]) == 0 {
                check(&spec, 100);
                let mut got = 0;
                segment(&spec.vnet(100), &frame, &mut Vec::new(), |s| {
                    got = be16(s, l4 + 6)
                })
                .unwrap();
                assert_eq!(got, 0xffff);
                hit = true;
                break;
            }
        }
        assert!(hit);
    }

    #[test]
    fn ethernet_padding_is_trimmed() {
        let spec = Spec::tcp4(vec![0xab; 3]);
        let mut frame = spec.build();
        frame.resize(frame.len() + 11, 0); // padding after the IP packet
        let mut segs = Vec::new();
        segment(&spec.vnet(1), &frame, &mut Vec::new(), |s| {
            segs.push(s.to_vec())
        })
        .unwrap();
        assert_eq!(segs.len(), 3);
        assert!(segs.iter().all(|s| s.len() == spec.hdrs() + 1));
    }

    #[test]
    fn zero_ip_length_means_rest_of_frame() {
        // IPv4 total length 0 (as for Windows LSO / Linux BIG TCP) and IPv6 payload length 0.
        for v6 in [false, true] {
            let spec = Spec {
                v6,
                ..Spec::tcp4(vec![0x5a; 3000])
            };
            let mut frame = spec.build();
            let at = spec.l2() + if v6 { 4 } else { 2 };
            frame[at] = 0;
            frame[at + 1] = 0;
            let mut total = 0;
            let n = segment(&spec.vnet(1448), &frame, &mut Vec::new(), |s| {
                total += s.len() - spec.hdrs()
            })
            .unwrap();
            assert_eq!((n, total), (3, 3000));
        }
    }

    #[test]
    fn scratch_does_not_grow_after_warm_up() {
        let spec = Spec::tcp4(Rng(5).bytes(20_000));
        let frame = spec.build();
        let mut scratch = Vec::new();
        segment(&spec.vnet(1448), &frame, &mut scratch, |_| {}).unwrap();
        let (cap, ptr) = (scratch.capacity(), scratch.as_ptr());
        for _ in 0..3 {
            segment(&spec.vnet(1448), &frame, &mut scratch, |_| {}).unwrap();
        }
        assert_eq!((scratch.capacity(), scratch.as_ptr()), (cap, ptr));
    }

    /// A receiver with no room stops the cutting: no segment is computed past the one it
    /// refused, and the ones before are those `segment` makes.
    #[test]
    fn segment_while_stops_where_the_receiver_does() {
        let spec = Spec::tcp4(Rng(7).bytes(20_000));
        let frame = spec.build();
        let mut all = Vec::new();
        let n = segment(&spec.vnet(1000), &frame, &mut Vec::new(), |s| {
            all.push(s.to_vec())
        })
        .unwrap();
        assert_eq!(n, 20);
        for take in [1usize, 2, 19, 20] {
            let mut got = Vec::new();
            let k = segment_while(&spec.vnet(1000), &frame, &mut Vec::new(), |s| {
                got.push(s.to_vec());
                got.len() < take
            })
            .unwrap();
            assert_eq!(k, take, "stopped after the segment refused");
            assert_eq!(got[..], all[..take]);
        }
    }

    #[test]
    fn complete_csum_matches_reference() {
        let mut rng = Rng(6);
        for (udp, v6, plen) in [
            (false, false, 0),
            (false, false, 1),
            (false, true, 1001),
            (true, false, 77),
            (true, true, 1500),
        ] {
            let spec = Spec {
                udp,
                v6,
                ..Spec::tcp4(rng.bytes(plen))
            };
            let mut frame = spec.build();
            let h = spec.vnet(0);
            let l4 = usize::from(h.csum_start);
            let field = l4 + usize::from(h.csum_offset);
            complete_csum(&mut frame, h.csum_start, h.csum_offset).unwrap();
            let len = frame.len() - l4;
            assert_eq!(ref_csum(&[&spec.pseudo(&frame, len), &frame[l4..]]), 0);
            let mut zeroed = frame[l4..].to_vec();
            zeroed[field - l4] = 0;
            zeroed[field - l4 + 1] = 0;
            assert_eq!(
                be16(&frame, field),
                ref_csum(&[&spec.pseudo(&frame, len), &zeroed])
            );
        }
        // Arbitrary data, odd starts and lengths: the field's old value takes part in the sum.
        for len in 2..200 {
            let d = rng.bytes(len);
            for start in 0..len.min(9) {
                for off in 0..(len - start - 1).min(5) {
                    let mut f = d.clone();
                    complete_csum(
                        &mut f,
                        u16::try_from(start).unwrap(),
                        u16::try_from(off).unwrap(),
                    )
                    .unwrap();
                    let field = start + off;
                    assert_eq!(be16(&f, field), ref_csum(&[&d[start..]]));
                    assert_eq!(f[..field], d[..field]);
                    assert_eq!(f[field + 2..], d[field + 2..]);
                }
            }
        }
    }

    #[test]
    fn complete_csum_rejects_out_of_range() {
        let mut f = vec![0u8; 40];
        let err = |s, o| OffloadError::CsumOutOfRange {
            start: s,
            offset: o,
            len: 40,
        };
        assert_eq!(complete_csum(&mut f, 38, 1), Err(err(38, 1)));
        assert_eq!(complete_csum(&mut f, 40, 0), Err(err(40, 0)));
        assert_eq!(
            complete_csum(&mut f, u16::MAX, u16::MAX),
            Err(err(u16::MAX, u16::MAX))
        );
        assert_eq!(complete_csum(&mut f, 0, 39), Err(err(0, 39)));
        assert_eq!(
            complete_csum(&mut [], 0, 0),
            Err(OffloadError::CsumOutOfRange {
                start: 0,
                offset: 0,
                len: 0
            })
        );
        assert!(f.iter().all(|&b| b == 0));
        assert_eq!(complete_csum(&mut f, 38, 0), Ok(()));
        assert_eq!(complete_csum(&mut f, 0, 38), Ok(()));
    }

    fn seg_err(hdr: &VnetHdr, frame: &[u8]) -> OffloadError {
        let mut called = false;
        let e = segment(hdr, frame, &mut Vec::new(), |_| called = true).unwrap_err();
        assert!(!called, "nothing may be emitted on error");
        e
    }

    #[test]
    fn segment_errors() {
        let spec = Spec::tcp4(vec![1; 3000]);
        let frame = spec.build();
        let h = spec.vnet(1000);
        let (l3, l4) = (spec.l2(), spec.l2() + spec.l3_len());

        // GSO header.
        for t in [GSO_NONE, GSO_UDP, 2, 6, 0x7f, GSO_UDP_L4 | GSO_ECN] {
            assert_eq!(
                seg_err(&VnetHdr { gso_type: t, ..h }, &frame),
                OffloadError::UnsupportedGsoType(t)
            );
        }
        assert_eq!(
            seg_err(&VnetHdr { gso_size: 0, ..h }, &frame),
            OffloadError::ZeroGsoSize
        );
        let long = VnetHdr {
            hdr_len: u16::try_from(frame.len() + 1).unwrap(),
            ..h
        };
        assert!(matches!(
            seg_err(&long, &frame),
            OffloadError::HdrLenOutOfRange { .. }
        ));
        assert_eq!(
            seg_err(
                &VnetHdr {
                    gso_type: GSO_TCPV6,
                    ..h
                },
                &frame
            ),
            OffloadError::GsoTypeMismatch {
                gso_type: 4,
                packet: "IPv4/TCP"
            }
        );
        assert!(matches!(
            seg_err(
                &VnetHdr {
                    gso_type: GSO_UDP_L4,
                    ..h
                },
                &frame
            ),
            OffloadError::GsoTypeMismatch { .. }
        ));
        // hdr_len is a hint: smaller than the real headers is fine.
        segment(
            &VnetHdr { hdr_len: 0, ..h },
            &frame,
            &mut Vec::new(),
            |_| {},
        )
        .unwrap();

        // Truncation at every layer.
        for cut in [0, 13, 14, l3 + 19, l4 - 1, l4 + 19, spec.hdrs() - 1] {
            let mut f = frame[..cut].to_vec();
            if cut > l3 + 4 {
                // Keep the IP length consistent so the L4 truncation is what is reported.
                let tot = u16::try_from(cut - l3).unwrap();
                f[l3 + 2..l3 + 4].copy_from_slice(&tot.to_be_bytes());
            }
            let hh = VnetHdr { hdr_len: 0, ..h };
            assert!(
                matches!(seg_err(&hh, &f), OffloadError::Truncated { .. }),
                "cut at {cut}: {:?}",
                seg_err(&hh, &f)
            );
        }
        let vlan = Spec {
            vlan: Some(1),
            ..spec.clone()
        };
        assert!(matches!(
            seg_err(&VnetHdr { hdr_len: 0, ..h }, &vlan.build()[..17]),
            OffloadError::Truncated { layer: "VLAN", .. }
        ));

        let patch = |at: usize, v: &[u8]| {
            let mut f = frame.clone();
            f[at..at + v.len()].copy_from_slice(v);
            f
        };
        assert_eq!(
            seg_err(&h, &patch(12, &[0x08, 0x06])),
            OffloadError::UnsupportedEtherType(0x0806)
        );
        // One tag, 802.1Q or 802.1ad, is fine; two are not.
        let tagged = Spec {
            vlan: Some(1),
            ..spec.clone()
        };
        let mut ad = tagged.build();
        ad[12..14].copy_from_slice(&[0x88, 0xa8]);
        let n = segment(&tagged.vnet(1000), &ad, &mut Vec::new(), |s| {
            assert_eq!(s[12..18], ad[12..18]);
        });
        assert_eq!(n, Ok(3));
        let mut double = ad.clone();
        double[16..18].copy_from_slice(&[0x81, 0x00]);
        assert_eq!(
            seg_err(&VnetHdr { hdr_len: 0, ..h }, &double),
            OffloadError::UnsupportedEtherType(0x8100)
        );
        assert_eq!(
            seg_err(&h, &patch(l3 + 9, &[1])),
            OffloadError::UnsupportedProtocol(1)
        );
        assert!(matches!(
            seg_err(&h, &patch(l3, &[0x65])),
            OffloadError::Malformed(_)
        ));
        assert!(matches!(
            seg_err(&h, &patch(l3, &[0x44])),
            OffloadError::Malformed(_)
        ));
        assert_eq!(
            seg_err(&h, &patch(l3 + 6, &[0x20, 0])),
            OffloadError::Fragment
        );
        assert_eq!(
            seg_err(&h, &patch(l3 + 6, &[0x00, 0x01])),
            OffloadError::Fragment
        );
        assert!(matches!(
            seg_err(&h, &patch(l3 + 2, &[0xff, 0xff])),
            OffloadError::IpLength { .. }
        ));
        assert!(matches!(
            seg_err(&h, &patch(l3 + 2, &[0, 19])),
            OffloadError::Malformed(_)
        ));
        assert!(matches!(
            seg_err(&h, &patch(l4 + 12, &[0x40])),
            OffloadError::Malformed(_)
        ));
        // TCP header (60 bytes claimed) past the IP packet end when the IP length is short.
        let mut short = patch(l4 + 12, &[0xf0]);
        let tot = u16::try_from(spec.l3_len() + 40).unwrap();
        short[l3 + 2..l3 + 4].copy_from_slice(&tot.to_be_bytes());
        assert!(matches!(
            seg_err(&VnetHdr { hdr_len: 0, ..h }, &short),
            OffloadError::Truncated {
                layer: "TCP options",
                ..
            }
        ));

        // IPv6: extension header, bad version, payload length past the frame.
        let s6 = Spec {
            v6: true,
            ..spec.clone()
        };
        let f6 = s6.build();
        let h6 = s6.vnet(1000);
        let p6 = |at: usize, v: &[u8]| {
            let mut f = f6.clone();
            f[at..at + v.len()].copy_from_slice(v);
            f
        };
        assert_eq!(
            seg_err(&h6, &p6(l3 + 6, &[0])),
            OffloadError::UnsupportedProtocol(0)
        );
        assert_eq!(
            seg_err(&h6, &p6(l3 + 6, &[44])),
            OffloadError::UnsupportedProtocol(44)
        );
        assert!(matches!(
            seg_err(&h6, &p6(l3, &[0x40])),
            OffloadError::Malformed(_)
        ));
        assert!(matches!(
            seg_err(&h6, &p6(l3 + 4, &[0xff, 0xff])),
            OffloadError::IpLength { .. }
        ));

        // Over 64 KiB with a zero length field.
        for (s, at) in [(spec.clone(), l3 + 2), (s6.clone(), l3 + 4)] {
            let mut f = Spec {
                payload: vec![],
                ..s.clone()
            }
            .build();
            f.resize(f.len() + 70_000, 0);
            f[at..at + 2].copy_from_slice(&[0, 0]);
            let hh = VnetHdr {
                hdr_len: 0,
                ..s.vnet(1000)
            };
            assert!(matches!(seg_err(&hh, &f), OffloadError::TooLarge(_)));
        }
        // Largest accepted: an IPv4 packet of exactly 65535 bytes.
        let max = Spec::tcp4(vec![9; 65_535 - 20 - 32]);
        assert_eq!(max.build().len() - max.l2(), MAX_GSO_LEN);
        check(&max, 65_535);

        // Error messages read well.
        assert_eq!(
            OffloadError::Truncated {
                layer: "TCP",
                need: 54,
                have: 40
            }
            .to_string(),
            "truncated TCP header: needs 54 bytes, only 40 available"
        );
        assert_eq!(
            OffloadError::UnsupportedEtherType(0x806).to_string(),
            "unsupported EtherType 0x0806: only IPv4 and IPv6, behind at most one VLAN tag"
        );
    }

    /// Checks segments of an arbitrary accepted frame: each one parses with the same header
    /// layout, its lengths match, its checksums verify (reference sums), all but the last carry
    /// gso_size bytes, and the payloads add up to the original's.
    fn verify_emitted(h: &VnetHdr, frame: &[u8], segs: &[Vec<u8>]) {
        let lay = Layout::parse(frame).unwrap();
        assert!(!segs.is_empty());
        let mut joined = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let sl = Layout::parse(seg).unwrap();
            assert_eq!(
                (sl.l3, sl.l4, sl.payload, sl.v4, sl.tcp),
                (lay.l3, lay.l4, lay.payload, lay.v4, lay.tcp)
            );
            assert_eq!(sl.end, seg.len());
            let n = seg.len() - sl.payload;
            assert!(n <= usize::from(h.gso_size));
            if i + 1 < segs.len() {
                assert_eq!(n, usize::from(h.gso_size));
            }
            assert_eq!(seg[..sl.l3], frame[..sl.l3]);
            let l4_len = seg.len() - sl.l4;
            let proto = if sl.tcp { 6 } else { 17 };
            let pseudo = if sl.v4 {
                assert_eq!(ref_csum(&[&seg[sl.l3..sl.l4]]), 0);
                [
                    &seg[sl.l3 + 12..sl.l3 + 20],
                    &[0, proto],
                    &u16::try_from(l4_len).unwrap().to_be_bytes()[..],
                ]
                .concat()
            } else {
                [
                    &seg[sl.l3 + 8..sl.l3 + 40],
                    &u32::try_from(l4_len).unwrap().to_be_bytes()[..],
                    &[0, 0, 0, proto],
                ]
                .concat()
            };
            assert_eq!(ref_csum(&[&pseudo, &seg[sl.l4..]]), 0);
            joined.extend_from_slice(&seg[sl.payload..]);
        }
        assert_eq!(joined, frame[lay.payload..lay.end]);
    }

    fn spec_strategy() -> impl Strategy<Value = Spec> {
        (
            (any::<bool>(), any::<bool>(), prop::option::of(any::<u16>())),
            (
                0..=10usize,
                0..=10usize,
                any::<u8>(),
                any::<u32>(),
                any::<u16>(),
            ),
            prop::collection::vec(any::<u8>(), 0..4000),
        )
            .prop_map(
                |((v6, udp, vlan), (ipo, tcpo, tcp_flags, seq, ip_id), payload)| Spec {
                    vlan,
                    v6,
                    udp,
                    ip_opts: if v6 { 0 } else { ipo * 4 },
                    tcp_opts: if udp { 0 } else { tcpo * 4 },
                    tcp_flags,
                    seq,
                    ip_id,
                    payload,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
        ))]

        #[test]
        fn random_packets_segment_correctly(spec in spec_strategy(), g in 1u16..5000, ecn in any::<bool>()) {
            // Keep gso_size 1 from producing thousands of segments on big payloads now and then.
            let g = if spec.payload.len() > 600 { g.max(8) } else { g };
            check(&spec, g);
            if ecn && !spec.udp {
                let mut h = spec.vnet(g);
                h.gso_type |= GSO_ECN;
                let mut a = Vec::new();
                let mut b = Vec::new();
                let frame = spec.build();
                segment(&h, &frame, &mut Vec::new(), |s| a.push(s.to_vec())).unwrap();
                segment(&spec.vnet(g), &frame, &mut Vec::new(), |s| b.push(s.to_vec())).unwrap();
                prop_assert_eq!(a, b);
            }
        }

        #[test]
        fn complete_csum_random(data in prop::collection::vec(any::<u8>(), 2..600), start in any::<u16>(), off in any::<u16>()) {
            let start = start % u16::try_from(data.len()).unwrap();
            let off = off % 64;
            let mut f = data.clone();
            let field = usize::from(start) + usize::from(off);
            match complete_csum(&mut f, start, off) {
                Ok(()) => {
                    prop_assert!(field + 2 <= data.len());
                    prop_assert_eq!(be16(&f, field), ref_csum(&[&data[usize::from(start)..]]));
                }
                Err(_) => {
                    prop_assert!(field + 2 > data.len());
                    prop_assert_eq!(f, data);
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(hdr in prop::collection::vec(any::<u8>(), 0..16), frame in prop::collection::vec(any::<u8>(), 0..300)) {
            if let Some(h) = VnetHdr::parse(&hdr) {
                let mut segs = Vec::new();
                if let Ok(k) = segment(&h, &frame, &mut Vec::new(), |s| segs.push(s.to_vec())) {
                    prop_assert_eq!(k, segs.len());
                    verify_emitted(&h, &frame, &segs);
                }
                let mut f = frame.clone();
                let _ = complete_csum(&mut f, h.csum_start, h.csum_offset);
            }
        }

        #[test]
        fn mutated_packets_never_panic(
            spec in spec_strategy(),
            g in 1u16..3000,
            gso_type in prop::sample::select(vec![1u8, 4, 5, 0x81, 0x84, 0x85, 3, 0]),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            do_cut in any::<bool>(),
        ) {
            let mut frame = spec.build();
            // Mutate the header area mostly: that is where the parser looks.
            let hl = spec.hdrs();
            for (i, v) in edits {
                let at = i.index(hl);
                frame[at] = v;
            }
            if do_cut {
                frame.truncate(cut.index(frame.len() + 1));
            }
            let h = VnetHdr { gso_type, hdr_len: 0, ..spec.vnet(g) };
            let mut segs = Vec::new();
            if let Ok(k) = segment(&h, &frame, &mut Vec::new(), |s| segs.push(s.to_vec())) {
                prop_assert_eq!(k, segs.len());
                verify_emitted(&h, &frame, &segs);
            }
        }
    }
}
