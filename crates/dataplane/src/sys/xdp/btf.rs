//! The kernel's own type information (`/sys/kernel/btf/vmlinux`, BTF), read only to find a
//! kernel function's id: a BPF program calls a kfunc (`BPF_PSEUDO_KFUNC_CALL`) by the id of its
//! `BTF_KIND_FUNC` in the kernel's BTF, which differs from build to build.
//!
//! The format (Linux `Documentation/bpf/btf.rst`): a header (magic `0xeB9F`, its length, the
//! type and string sections' offsets and lengths), then the types, numbered from 1 in order,
//! each a 12-byte `btf_type` (name offset, info word: kind in bits 24-28 and `vlen` in bits
//! 0-15, size or type) followed by data whose length its kind and `vlen` give. Only the walk
//! and the names are read: nothing else of a type is trusted or kept.

use std::io;

/// Where the running kernel publishes its BTF.
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// The id of kernel function `name` in the running kernel's BTF.
pub fn kfunc_id(name: &str) -> io::Result<u32> {
    let btf = std::fs::read(VMLINUX).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{VMLINUX}: {e} (the kernel has no BTF: CONFIG_DEBUG_INFO_BTF)"),
        )
    })?;
    find_func(&btf, name).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("kernel function {name} is not in {VMLINUX}"),
        )
    })
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Bytes of kind-specific data after a `btf_type` of `kind` with `vlen` members; None for a
/// kind this walk does not know (a newer kernel's: the walk stops rather than guess).
fn extra(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // INT, ARRAY, VAR, DECL_TAG
        1 | 14 | 17 => 4,
        3 => 12,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        2 | 7..=12 | 16 | 18 => 0,
        // STRUCT, UNION, DATASEC, ENUM64
        4 | 5 | 15 | 19 => 12 * vlen,
        // ENUM, FUNC_PROTO
        6 | 13 => 8 * vlen,
        _ => return None,
    })
}

/// The id of the `BTF_KIND_FUNC` named `name` in the BTF blob `b` (little-endian, as every
/// kernel pvnet runs on writes it).
fn find_func(b: &[u8], name: &str) -> Option<u32> {
    if b.get(0..2)? != MAGIC.to_le_bytes() {
        return None;
    }
    let hdr_len = u32_at(b, 4)? as usize;
    let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
    let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
    let types = b.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
    let strs = b.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let want = name.as_bytes();
    let (mut at, mut id) = (0usize, 1u32);
    while at + 12 <= types.len() {
        let name_off = u32_at(types, at)? as usize;
        let info = u32_at(types, at + 4)?;
        let kind = (info >> 24) & 0x1f;
        if kind == KIND_FUNC {
            let s = strs.get(name_off..)?;
            let end = s.iter().position(|&c| c == 0)?;
            if &s[..end] == want {
                return Some(id);
            }
        }
        at += 12 + extra(kind, (info & 0xffff) as usize)?;
        id += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob of two types: an INT named "int" and a FUNC named "f".
    fn blob() -> Vec<u8> {
        let strs = b"\0int\0f\0";
        let mut types = Vec::new();
        for w in [1u32, 1 << 24, 4, 0] {
            types.extend_from_slice(&w.to_le_bytes());
        }
        for w in [5u32, KIND_FUNC << 24, 1] {
            types.extend_from_slice(&w.to_le_bytes());
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        let tl = u32::try_from(types.len()).unwrap();
        let sl = u32::try_from(strs.len()).unwrap();
        for w in [24u32, 0, tl, tl, sl] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&types);
        b.extend_from_slice(strs);
        b
    }

    #[test]
    fn a_function_is_found_by_name_past_the_types_before_it() {
        let b = blob();
        assert_eq!(find_func(&b, "f"), Some(2));
        // An INT has that name, not a FUNC.
        assert_eq!(find_func(&b, "int"), None);
        assert_eq!(find_func(&b, "g"), None);
        // Cut short anywhere: no answer, no panic.
        for n in 0..b.len() {
            let _ = find_func(&b[..n], "f");
        }
    }

    /// The running kernel's: the XDP RX-hash kfunc (Linux 6.3) is there.
    #[test]
    fn the_running_kernel_has_the_rx_hash_kfunc() {
        let id = kfunc_id("bpf_xdp_metadata_rx_hash").unwrap_or_else(|e| panic!("{e}"));
        assert!(id > 1000, "{id}");
    }
}
