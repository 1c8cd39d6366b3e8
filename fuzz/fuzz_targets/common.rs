//! What the fuzz targets share: taking input in pieces, and (device side) folding descriptor
//! addresses and lengths toward the mock's region (so most chains reach the deep checks).
//! Each target uses what it needs of it.
#![allow(dead_code)]

use virtq::mock::GPA_BASE;

/// Takes `n` bytes from the front of the input, zero-padded if it is short.
pub fn take(data: &mut &[u8], n: usize) -> Vec<u8> {
    let k = n.min(data.len());
    let (head, tail) = data.split_at(k);
    *data = tail;
    let mut v = head.to_vec();
    v.resize(n, 0);
    v
}

/// Takes exactly `n` bytes from the front of the input, or nothing if it is shorter (the
/// driver-side targets end a run there).
pub fn take_exact<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Some(head)
}

/// Folds 16-byte descriptors' addresses (bit 63 clear: into the region `span` bytes long, a
/// little before its start to a little past its end) and lengths (bit 31 clear: below 1024).
/// Both formats keep the address at bytes 0-8 and the length at bytes 8-12.
pub fn fold_descs(bytes: &mut [u8], span: u64) {
    for d in bytes.chunks_exact_mut(16) {
        let addr = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
        if addr >> 63 == 0 {
            let a = (GPA_BASE - 64) + addr % (span + 128);
            d[0..8].copy_from_slice(&a.to_le_bytes());
        }
        let len = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes"));
        if len >> 31 == 0 {
            d[8..12].copy_from_slice(&(len % 1024).to_le_bytes());
        }
    }
}
