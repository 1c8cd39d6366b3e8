//! The virtio-net header (virtio 1.x, 5.1.6): its layout, and its length, which depends on
//! what the driver negotiated.
//!
//! A driver that negotiated `VIRTIO_F_VERSION_1` or `VIRTIO_NET_F_MRG_RXBUF` puts the 12-byte
//! `virtio_net_hdr_v1` (with `num_buffers`) in front of every packet; a legacy driver with
//! neither uses the 10-byte `virtio_net_hdr`. Everything in pvnet that writes or skips a header
//! asks [`hdr_len`] (or a port's cached copy of it), never a literal.

use crate::features::{VIRTIO_F_VERSION_1, VIRTIO_NET_F_MRG_RXBUF};

/// Bytes of `virtio_net_hdr_v1` (VERSION_1 or MRG_RXBUF): `num_buffers` included. The header
/// pvnet uses inside the switch and toward the kernel (tap).
pub const HDR_LEN: u32 = 12;
/// Bytes of the legacy `virtio_net_hdr` (neither VERSION_1 nor MRG_RXBUF).
pub const HDR_LEN_LEGACY: u32 = 10;
/// Offset of `num_buffers` in `virtio_net_hdr_v1`.
pub const NUM_BUFFERS_OFF: u32 = 10;

/// Length of the header in front of every packet for a driver that acked `features`.
#[inline]
#[must_use]
pub const fn hdr_len(features: u64) -> u32 {
    if features & (VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF) != 0 {
        HDR_LEN
    } else {
        HDR_LEN_LEGACY
    }
}

// The `VIRTIO_NET_HDR_*` constants, also reachable as associated constants of [`VnetHdr`].
/// See [`VnetHdr::F_NEEDS_CSUM`].
pub const F_NEEDS_CSUM: u8 = VnetHdr::F_NEEDS_CSUM;
/// See [`VnetHdr::F_DATA_VALID`].
pub const F_DATA_VALID: u8 = VnetHdr::F_DATA_VALID;
/// See [`VnetHdr::GSO_NONE`].
pub const GSO_NONE: u8 = VnetHdr::GSO_NONE;
/// See [`VnetHdr::GSO_TCPV4`].
pub const GSO_TCPV4: u8 = VnetHdr::GSO_TCPV4;
/// See [`VnetHdr::GSO_UDP`].
pub const GSO_UDP: u8 = VnetHdr::GSO_UDP;
/// See [`VnetHdr::GSO_TCPV6`].
pub const GSO_TCPV6: u8 = VnetHdr::GSO_TCPV6;
/// See [`VnetHdr::GSO_UDP_L4`].
pub const GSO_UDP_L4: u8 = VnetHdr::GSO_UDP_L4;
/// See [`VnetHdr::GSO_ECN`].
pub const GSO_ECN: u8 = VnetHdr::GSO_ECN;

/// The 12-byte `struct virtio_net_hdr_v1` (virtio 1.x, 5.1.6), decoded from little endian.
///
/// `num_buffers` is only meaningful on receive with `VIRTIO_NET_F_MRG_RXBUF`; on transmit the
/// driver leaves it 0. Note that `gso_type` is a value plus the [`Self::GSO_ECN`] bit, not a set
/// of flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*` bits.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*` value, optionally with [`Self::GSO_ECN`].
    pub gso_type: u8,
    /// Length of the headers (Ethernet up to the end of TCP/UDP); a hint unless
    /// `VIRTIO_NET_F_GUEST_HDRLEN` was negotiated.
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS) when `gso_type` is not [`Self::GSO_NONE`].
    pub gso_size: u16,
    /// Offset in the frame where checksumming starts.
    pub csum_start: u16,
    /// Offset after `csum_start` where the 16-bit checksum is stored.
    pub csum_offset: u16,
    /// Number of merged receive buffers.
    pub num_buffers: u16,
}

impl VnetHdr {
    /// Bytes of the header on the wire (`virtio_net_hdr_v1`).
    pub const LEN: usize = HDR_LEN as usize;

    /// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` holds only the
    /// pseudo-header sum and must be completed over `frame[csum_start..]`.
    pub const F_NEEDS_CSUM: u8 = 1;
    /// `VIRTIO_NET_HDR_F_DATA_VALID`: (receive only) the checksum was already validated.
    pub const F_DATA_VALID: u8 = 2;
    /// `VIRTIO_NET_HDR_GSO_NONE`: not a GSO packet.
    pub const GSO_NONE: u8 = 0;
    /// `VIRTIO_NET_HDR_GSO_TCPV4`: TCP over IPv4 segmentation (TSO).
    pub const GSO_TCPV4: u8 = 1;
    /// `VIRTIO_NET_HDR_GSO_UDP`: UDP fragmentation offload (UFO, legacy; not supported here).
    pub const GSO_UDP: u8 = 3;
    /// `VIRTIO_NET_HDR_GSO_TCPV6`: TCP over IPv6 segmentation (TSO).
    pub const GSO_TCPV6: u8 = 4;
    /// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation (USO), IPv4 or IPv6.
    pub const GSO_UDP_L4: u8 = 5;
    /// `VIRTIO_NET_HDR_GSO_ECN`: the TCP packet may carry CWR (RFC 3168), which belongs on the
    /// first segment only.
    pub const GSO_ECN: u8 = 0x80;

    /// Decodes the first [`Self::LEN`] bytes of `buf`; `None` if `buf` is shorter.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        Self::parse_len(buf, HDR_LEN)
    }

    /// Decodes a header of `len` bytes ([`HDR_LEN`] or [`HDR_LEN_LEGACY`], see [`hdr_len`]):
    /// a legacy header has no `num_buffers` (0). `None` if `buf` is shorter.
    pub fn parse_len(buf: &[u8], len: u32) -> Option<Self> {
        let mut b = [0u8; Self::LEN];
        let n = (len as usize).min(Self::LEN);
        b[..n].copy_from_slice(buf.get(..n)?);
        let le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(Self {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
            num_buffers: le(10),
        })
    }

    /// Encodes the header into the first [`Self::LEN`] bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`Self::LEN`] (a caller bug: the caller sizes its buffers).
    pub fn write(&self, buf: &mut [u8]) {
        let b = &mut buf[..Self::LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
    }
}
