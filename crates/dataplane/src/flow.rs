//! The flow hash of an Ethernet frame: fq_codel's classification in an egress queue and a
//! multiqueue port's receive-ring steering both use it, and a generator stamps it on its
//! packets (as a NIC's RSS hash), so all three agree on what a flow is.

/// A flow hash of an Ethernet frame (fq_codel's classification here, and a multiqueue port's
/// receive-ring steering): see [`flow_hash_head`]; the frame's first 64 bytes are copied
/// once.
pub(crate) fn flow_hash(f: &[u8]) -> u64 {
    let mut head = [0u8; 64];
    let n = f.len().min(64);
    head[..n].copy_from_slice(&f[..n]);
    flow_hash_head(&head, f.len())
}

/// Whether a frame of this EtherType is hashed past its Ethernet addresses by
/// [`flow_hash_head`] (IPv4, IPv6, or behind a VLAN tag).
#[inline]
pub(crate) fn hashes_l3(ethertype: u16) -> bool {
    matches!(ethertype, 0x0800 | 0x86dd | 0x8100 | 0x88a8)
}

/// [`flow_hash_head`] of a frame that carries no IP (its EtherType fails [`hashes_l3`]):
/// its destination and source addresses only.
#[inline]
pub(crate) fn flow_hash_l2(macs: [u8; 12]) -> u64 {
    let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    let w64 = u64::from_le_bytes(macs[..8].try_into().unwrap_or([0; 8]));
    let w32 = u64::from(u32::from_le_bytes(macs[8..].try_into().unwrap_or([0; 4])));
    mix(mix(0, w64), w32)
}

/// The flow hash of a frame from its first 64 bytes (`len`: the frame's length; bytes past it
/// are not read): IPv4 or IPv6 addresses, protocol and, for TCP, UDP and SCTP, ports (not
/// for a fragment: they are in the first fragment only), behind one VLAN tag too; else the
/// Ethernet addresses. Word loads and one multiply per word: a few tens of instructions.
#[inline]
pub(crate) fn flow_hash_head(f: &[u8; 64], len: usize) -> u64 {
    let w64 = |at: usize| u64::from_le_bytes(f[at..at + 8].try_into().unwrap_or([0; 8]));
    let w32 = |at: usize| {
        u64::from(u32::from_le_bytes(
            f[at..at + 4].try_into().unwrap_or([0; 4]),
        ))
    };
    let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    let mut l3 = 14;
    let mut et = u16::from_be_bytes([f[12], f[13]]);
    if et == 0x8100 || et == 0x88a8 {
        et = u16::from_be_bytes([f[16], f[17]]);
        l3 = 18;
    }
    let (mut h, l4) = match et {
        0x0800 if len >= l3 + 20 => {
            let proto = f[l3 + 9];
            let frag = u16::from_be_bytes([f[l3 + 6], f[l3 + 7]]) & 0x3fff != 0;
            let l4 = (!frag).then_some((proto, l3 + usize::from(f[l3] & 0x0f) * 4));
            (mix(u64::from(proto), w64(l3 + 12)), l4)
        }
        0x86dd if len >= l3 + 40 => {
            let proto = f[l3 + 6];
            let mut h = u64::from(proto);
            for k in 0..4 {
                h = mix(h, w64(l3 + 8 + 8 * k));
            }
            (h, Some((proto, l3 + 40)))
        }
        _ => return flow_hash_l2(f[..12].try_into().unwrap_or([0; 12])),
    };
    if let Some((6 | 17 | 132, at)) = l4 {
        if at + 4 <= len.min(64) {
            h = mix(h, w32(at));
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::udp_frame;

    #[test]
    fn flows_hash_by_addresses_and_ports() {
        let a = udp_frame(12, 1, 64);
        let b = udp_frame(12, 2, 64);
        // Longer, and with other bytes past the headers: the same flow.
        let mut a2 = udp_frame(12, 1, 128);
        let n = a2.len();
        a2[n - 4..].copy_from_slice(&7u32.to_le_bytes());
        assert_ne!(flow_hash(&a[12..]), flow_hash(&b[12..]));
        assert_eq!(flow_hash(&a[12..]), flow_hash(&a2[12..]));
    }
}
