//! The software offload fallbacks against a hostile guest: the input is a virtio-net header and
//! the Ethernet frame it describes, fed to `VnetHdr::parse`, `offload::segment` and
//! `offload::complete_csum`.
//!
//! Input layout:
//! * byte 0: bit 0 "shape" the frame (below), bits 1-3 the GSO type used when shaping, bit 4 a
//!   VLAN tag when shaping, bit 5 keep the IP length field (else 0: "rest of the frame");
//! * 12 bytes: `virtio_net_hdr_v1`;
//! * the rest: the frame.
//!
//! Shaping makes most inputs reach segmentation: it writes the EtherType (and VLAN tag), the IP
//! version, an IHL of at least 5, the protocol, clears the IPv4 fragment bits, zeroes the IP
//! length field (unless bit 5), raises a TCP data offset below 5 and caps `gso_size` below
//! 2048 so that tiny segments of big frames stay fast. Unshaped inputs go in as they are.
//!
//! Must never panic. The oracle, on every segmented packet: as many segments as reported; each
//! one parses (by this harness's own parser) with the original's header layout; IPv4 header
//! and TCP/UDP checksums verify (reference sum below); length fields match the segment; all
//! but the last segment carry `gso_size` bytes; the payloads concatenate to the original's.
//! On `complete_csum`: only the 2-byte field changes, it holds the complement of the sum over
//! `frame[csum_start..]` (field included), and, for an even `csum_offset`, the result verifies.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pvnet_net::offload::{self, VnetHdr};

/// Textbook Internet checksum sum of the concatenation of `parts`, folded, not complemented.
fn ref_sum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut odd: Option<u8> = None;
    for p in parts {
        for &b in *p {
            match odd.take() {
                None => odd = Some(b),
                Some(hi) => sum += u64::from(u16::from_be_bytes([hi, b])),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u64::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    u16::try_from(sum).expect("folded")
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Header offsets of a frame `segment` accepted: (l3, l4, payload, ipv4, tcp).
fn layout(f: &[u8]) -> (usize, usize, usize, bool, bool) {
    let mut l3 = 14;
    let mut et = be16(f, 12);
    if et == 0x8100 || et == 0x88a8 {
        l3 = 18;
        et = be16(f, 16);
    }
    let v4 = et == 0x0800;
    assert!(v4 || et == 0x86dd, "EtherType {et:#x}");
    let (l4, proto) = if v4 {
        (l3 + usize::from(f[l3] & 0xf) * 4, f[l3 + 9])
    } else {
        (l3 + 40, f[l3 + 6])
    };
    let tcp = proto == 6;
    assert!(tcp || proto == 17, "protocol {proto}");
    let payload = if tcp {
        l4 + usize::from(f[l4 + 12] >> 4) * 4
    } else {
        l4 + 8
    };
    (l3, l4, payload, v4, tcp)
}

/// See the module doc.
fn shape(cfg: u8, hdr: &mut VnetHdr, f: &mut [u8]) {
    let (gso_type, v6) = [
        (VnetHdr::GSO_TCPV4, false),
        (VnetHdr::GSO_TCPV6, true),
        (VnetHdr::GSO_UDP_L4, false),
        (VnetHdr::GSO_UDP_L4, true),
        (VnetHdr::GSO_TCPV4 | VnetHdr::GSO_ECN, false),
        (VnetHdr::GSO_TCPV6 | VnetHdr::GSO_ECN, true),
        (VnetHdr::GSO_TCPV4, false),
        (VnetHdr::GSO_TCPV6, true),
    ][usize::from((cfg >> 1) & 7)];
    let tcp = gso_type & !VnetHdr::GSO_ECN != VnetHdr::GSO_UDP_L4;
    hdr.gso_type = gso_type;
    hdr.gso_size %= 2048;
    let mut l3 = 14;
    if cfg & 0x10 != 0 {
        if f.len() < 18 {
            return;
        }
        f[12..14].copy_from_slice(&[0x81, 0x00]);
        l3 = 18;
    }
    let et: &[u8; 2] = if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] };
    if f.len() < l3 {
        return;
    }
    f[l3 - 2..l3].copy_from_slice(et);
    let keep_len = cfg & 0x20 != 0;
    let proto = if tcp { 6 } else { 17 };
    let l4 = if v6 {
        if f.len() < l3 + 40 {
            return;
        }
        f[l3] = 0x60 | (f[l3] & 0xf);
        f[l3 + 6] = proto;
        if !keep_len {
            f[l3 + 4..l3 + 6].fill(0);
        }
        l3 + 40
    } else {
        if f.len() < l3 + 20 {
            return;
        }
        f[l3] = 0x40 | (f[l3] & 0xf).max(5);
        f[l3 + 6] &= 0x40; // keep DF only
        f[l3 + 7] = 0;
        f[l3 + 9] = proto;
        if !keep_len {
            f[l3 + 2..l3 + 4].fill(0);
        }
        l3 + usize::from(f[l3] & 0xf) * 4
    };
    if tcp && f.len() > l4 + 12 && f[l4 + 12] >> 4 < 5 {
        f[l4 + 12] = 0x50 | (f[l4 + 12] & 0xf);
    }
}

fn check_segments(hdr: &VnetHdr, frame: &[u8], segs: &[Vec<u8>]) {
    assert!(!segs.is_empty());
    let (l3, l4, pay, v4, tcp) = layout(frame);
    let gso = usize::from(hdr.gso_size);
    let mut joined: Vec<u8> = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        assert_eq!(layout(s), (l3, l4, pay, v4, tcp), "segment {i} layout");
        assert_eq!(s[..l3], frame[..l3], "L2 header");
        let n = s.len() - pay;
        if i + 1 < segs.len() {
            assert_eq!(n, gso, "segment {i} size");
        } else {
            assert!(n <= gso, "last segment size");
        }
        let l4_len = s.len() - l4;
        let l4_len16 = u16::try_from(l4_len).expect("L4 length fits");
        let proto = if tcp { 6 } else { 17 };
        let pseudo: Vec<u8> = if v4 {
            assert_eq!(
                usize::from(be16(s, l3 + 2)),
                s.len() - l3,
                "IPv4 total length"
            );
            assert_eq!(ref_sum(&[&s[l3..l4]]), 0xffff, "IPv4 header checksum");
            [
                &s[l3 + 12..l3 + 20],
                &[0, proto],
                &l4_len16.to_be_bytes()[..],
            ]
            .concat()
        } else {
            assert_eq!(be16(s, l3 + 4), l4_len16, "IPv6 payload length");
            [
                &s[l3 + 8..l3 + 40],
                &[0, 0],
                &l4_len16.to_be_bytes()[..],
                &[0, 0, 0, proto],
            ]
            .concat()
        };
        assert_eq!(
            ref_sum(&[&pseudo, &s[l4..]]),
            0xffff,
            "L4 checksum of segment {i}"
        );
        if !tcp {
            assert_eq!(be16(s, l4 + 4), l4_len16, "UDP length");
            assert_ne!(be16(s, l4 + 6), 0, "UDP checksum 0 must go out as 0xffff");
        }
        joined.extend_from_slice(&s[pay..]);
    }
    assert!(pay + joined.len() <= frame.len());
    assert_eq!(joined, frame[pay..pay + joined.len()], "payloads");
    let len_field = if v4 {
        be16(frame, l3 + 2)
    } else {
        be16(frame, l3 + 4)
    };
    if len_field == 0 {
        assert_eq!(
            pay + joined.len(),
            frame.len(),
            "zero IP length: all of the frame"
        );
    }
}

/// Whether the checksum field is 16-bit aligned relative to `csum_start` (always so for
/// TCP and UDP; an odd one is nonsense from the guest but must not break anything).
fn csum_offset_even(hdr: &VnetHdr) -> bool {
    hdr.csum_offset & 1 == 0
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let Some(mut hdr) = VnetHdr::parse(rest) else {
        return;
    };
    let mut re = [0u8; VnetHdr::LEN];
    hdr.write(&mut re);
    assert_eq!(re[..], rest[..VnetHdr::LEN], "header round trip");
    let mut frame = rest[VnetHdr::LEN..].to_vec();
    if cfg & 1 != 0 {
        shape(cfg, &mut hdr, &mut frame);
    }

    let mut scratch = Vec::new();
    let mut segs: Vec<Vec<u8>> = Vec::new();
    if let Ok(n) = offload::segment(&hdr, &frame, &mut scratch, |s| segs.push(s.to_vec())) {
        assert_eq!(n, segs.len(), "reported segment count");
        check_segments(&hdr, &frame, &segs);
    } else {
        assert!(segs.is_empty(), "segments emitted before an error");
    }

    let mut f = frame.clone();
    let (start, field) = (
        usize::from(hdr.csum_start),
        usize::from(hdr.csum_start) + usize::from(hdr.csum_offset),
    );
    match offload::complete_csum(&mut f, hdr.csum_start, hdr.csum_offset) {
        Ok(()) => {
            assert!(field + 2 <= frame.len());
            assert_eq!(f[..field], frame[..field]);
            assert_eq!(f[field + 2..], frame[field + 2..]);
            // The field held the pseudo-header sum and took part in the sum, as in Linux.
            assert_eq!(
                be16(&f, field),
                !ref_sum(&[&frame[start..]]),
                "complete_csum value"
            );
            if csum_offset_even(&hdr) {
                // Then, with the pseudo-header sum added back, the result verifies.
                let p = u32::from(be16(&frame, field));
                let mut s = u32::from(ref_sum(&[&f[start..]])) + p;
                s = (s & 0xffff) + (s >> 16);
                assert!(
                    s == 0xffff || s == 0,
                    "complete_csum result does not verify"
                );
            }
        }
        Err(_) => {
            assert!(field + 2 > frame.len());
            assert_eq!(f, frame);
        }
    }
});
