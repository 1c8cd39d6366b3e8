//! ECN marking (RFC 3168): what an AQM does to a packet whose sender can take congestion
//! as a mark instead of a loss (Linux's `INET_ECN_set_ce`, which fq_codel calls before it
//! drops).

/// Sets Congestion Experienced in the IP header of `frame` (an Ethernet frame, untagged or
/// with one 802.1Q/802.1ad tag) if its sender declared ECN-capable transport (ECT(0) or
/// ECT(1)); an IPv4 header's checksum is updated for the change (RFC 1624). True if the
/// packet now carries CE (marked here, or it already did); false if it is not ECN-capable
/// (Not-ECT, not IP, or too short to tell): the AQM drops it instead.
pub fn set_ce(frame: &mut [u8]) -> bool {
    let (mut ty, mut l3) = (be16(frame, 12), 14);
    if matches!(ty, Some(0x8100 | 0x88a8)) {
        (ty, l3) = (be16(frame, 16), 18);
    }
    match ty {
        Some(0x0800) => {
            let Some(h) = frame.get_mut(l3..l3 + 20) else {
                return false;
            };
            if h[0] >> 4 != 4 {
                return false;
            }
            match h[1] & 3 {
                0 => false,
                3 => true,
                _ => {
                    let old = u16::from_be_bytes([h[0], h[1]]);
                    h[1] |= 3;
                    let new = u16::from_be_bytes([h[0], h[1]]);
                    // RFC 1624 (3): HC' = ~(~HC + ~m + m'), in one's complement.
                    let hc = u16::from_be_bytes([h[10], h[11]]);
                    let mut s = u32::from(!hc) + u32::from(!old) + u32::from(new);
                    s = (s & 0xffff) + (s >> 16);
                    s = (s & 0xffff) + (s >> 16);
                    let c = !u16::try_from(s).unwrap_or(u16::MAX);
                    h[10..12].copy_from_slice(&c.to_be_bytes());
                    true
                }
            }
        }
        Some(0x86dd) => {
            // Version, then the traffic class across the first two bytes: its two low bits,
            // the ECN field, are bits 5 and 4 of the second.
            let Some(h) = frame.get_mut(l3..l3 + 40) else {
                return false;
            };
            if h[0] >> 4 != 6 {
                return false;
            }
            match (h[1] >> 4) & 3 {
                0 => false,
                3 => true,
                _ => {
                    h[1] |= 0x30;
                    true
                }
            }
        }
        _ => false,
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 header checksum of `h` (20 bytes) computed from scratch: 0 when valid.
    fn verify(h: &[u8]) -> u16 {
        !crate::offload::fold(crate::offload::sum_be(h))
    }

    fn ipv4(tos: u8, tagged: bool) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        if tagged {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x0a]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let mut h = [
            0x45, tos, 0x00, 0x54, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0, 0, 10, 0, 0, 1, 10, 0, 0,
            2,
        ];
        // With its checksum field zero, the header's complemented sum is its checksum.
        let c = verify(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(verify(&h), 0);
        f.extend_from_slice(&h);
        f.extend_from_slice(&[0u8; 8]);
        f
    }

    #[test]
    fn ect_ipv4_is_marked_with_a_valid_checksum_and_the_rest_is_left_alone() {
        for (tos, tagged) in [(0x02, false), (0x01, false), (0xba, true), (0x01, true)] {
            let mut f = ipv4(tos, tagged);
            let l3 = if tagged { 18 } else { 14 };
            assert!(set_ce(&mut f), "{tos:#x}");
            assert_eq!(f[l3 + 1], tos | 3, "DSCP kept, CE set");
            assert_eq!(verify(&f[l3..l3 + 20]), 0, "{tos:#x}: checksum valid after");
        }
        let f0 = ipv4(0xb8, false);
        let mut f = f0.clone();
        assert!(!set_ce(&mut f), "Not-ECT: dropped, not marked");
        assert_eq!(f, f0);
        let f0 = ipv4(0x03, false);
        let mut f = f0.clone();
        assert!(set_ce(&mut f), "already CE");
        assert_eq!(f, f0);
    }

    #[test]
    fn ect_ipv6_is_marked_and_other_frames_are_not() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x86, 0xdd]);
        // Version 6, traffic class 0xb9 (DSCP 46, ECT(1)), flow label 0x12345.
        f.extend_from_slice(&[0x6b, 0x91, 0x23, 0x45]);
        f.extend_from_slice(&[0u8; 36]);
        assert!(set_ce(&mut f));
        assert_eq!(
            &f[14..18],
            &[0x6b, 0xb1, 0x23, 0x45],
            "CE in the traffic class only"
        );
        f[15] = 0x01; // traffic class 0xb0: Not-ECT
        assert!(!set_ce(&mut f));
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        assert!(!set_ce(&mut arp));
        let mut short = ipv4(0x02, false);
        short.truncate(20);
        assert!(!set_ce(&mut short), "too short to tell");
        assert!(!set_ce(&mut []));
    }
}
