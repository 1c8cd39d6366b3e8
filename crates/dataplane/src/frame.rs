//! Frames that `gen` ports and pvnet's frontend produce, and `sink` ports check: an Ethernet
//! header with a local experimental EtherType, a magic, a kind, and a sequence number (or, in
//! the end marker, the number of data frames that preceded it).
//!
//! ```text
//! 0..6 dst | 6..12 src | 12..14 0x88b5 | 14..18 "PVNB" | 18 kind | 19..22 0 | 22..30 seq/count LE
//! ```

/// IEEE local experimental EtherType 1.
pub const ETHERTYPE: u16 = 0x88b5;
/// Magic after the Ethernet header.
pub const MAGIC: [u8; 4] = *b"PVNB";
/// Bytes the header of a bench frame needs.
pub const MIN_FRAME: usize = 30;
const KIND_DATA: u8 = 0;
const KIND_END: u8 = 1;
/// A request of `pvnet frontend --role rr`, asking for an answer.
pub const KIND_REQUEST: u8 = 2;
/// An answer to a [`KIND_REQUEST`] frame (`pvnet frontend --role echo`).
pub const KIND_REPLY: u8 = 3;

/// Its kind byte (`KIND_*`), if `head` is a bench frame.
#[inline]
pub fn kind(head: &[u8]) -> Option<u8> {
    (head.len() >= MIN_FRAME && head[12..14] == ETHERTYPE.to_be_bytes() && head[14..18] == MAGIC)
        .then(|| head[18])
}

/// Sets a templated frame's kind (after [`set_seq`], which makes it a data frame).
#[inline]
pub fn set_kind(buf: &mut [u8], kind: u8) {
    buf[18] = kind;
}

/// What a received frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bench {
    /// Data frame with its sequence number.
    Data(u64),
    /// End of stream: this many data frames were sent before it.
    End(u64),
    /// Not a bench frame.
    Other,
}

/// Writes the fixed part of a frame (addresses, EtherType, magic) into `buf`, zero-filling up
/// to `len`. Done once per buffer; [`set_seq`] then patches only the sequence number.
pub fn write_template(buf: &mut [u8], len: usize, src: [u8; 6], dst: [u8; 6]) {
    let len = len.min(buf.len());
    buf[..len].fill(0);
    if len < MIN_FRAME {
        return;
    }
    buf[0..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    buf[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    buf[14..18].copy_from_slice(&MAGIC);
}

/// Sets a data frame's sequence number.
#[inline]
pub fn set_seq(buf: &mut [u8], seq: u64) {
    buf[18] = KIND_DATA;
    buf[22..30].copy_from_slice(&seq.to_le_bytes());
}

/// Turns a templated frame into the end marker carrying `count`.
pub fn set_end(buf: &mut [u8], count: u64) {
    buf[18] = KIND_END;
    buf[22..30].copy_from_slice(&count.to_le_bytes());
}

/// Classifies a frame from its first [`MIN_FRAME`] bytes.
#[inline]
pub fn parse(head: &[u8]) -> Bench {
    let Some(k) = kind(head) else {
        return Bench::Other;
    };
    let mut v = [0u8; 8];
    v.copy_from_slice(&head[22..30]);
    let v = u64::from_le_bytes(v);
    match k {
        KIND_DATA => Bench::Data(v),
        KIND_END => Bench::End(v),
        _ => Bench::Other,
    }
}

/// Checks a stream of bench frames: in order, none missing, end marker count matches.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct SeqCheck {
    /// Next expected sequence number.
    pub next: u64,
    /// Data frames seen.
    pub data: u64,
    /// Frames out of order or missing (each gap counts once).
    pub seq_errors: u64,
    /// Frames skipped by forward gaps (a gap of k frames adds k), the end marker's count
    /// past the last frame included: frames lost, if `backward` is 0.
    pub missing: u64,
    /// Frames whose number was below the expected one (duplicated or reordered).
    pub backward: u64,
    /// Count announced by the end marker, once it arrived.
    pub end: Option<u64>,
}

impl SeqCheck {
    /// Feeds one frame; returns true if it was the end marker.
    #[inline]
    pub fn feed(&mut self, b: Bench) -> bool {
        match b {
            Bench::Data(s) => {
                if s != self.next {
                    self.seq_errors += 1;
                    if s > self.next {
                        self.missing += s - self.next;
                    } else {
                        self.backward += 1;
                    }
                }
                self.next = s.wrapping_add(1);
                self.data += 1;
                false
            }
            Bench::End(c) => {
                self.missing += c.saturating_sub(self.next);
                self.end = Some(c);
                true
            }
            Bench::Other => false,
        }
    }

    /// True once the end marker arrived and every frame before it was seen, in order.
    pub fn complete(&self) -> bool {
        self.end == Some(self.data) && self.seq_errors == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let mut b = [0u8; 64];
        write_template(&mut b, 64, [2; 6], [4; 6]);
        set_seq(&mut b, 42);
        assert_eq!(parse(&b), Bench::Data(42));
        set_end(&mut b, 7);
        assert_eq!(parse(&b), Bench::End(7));
        assert_eq!(parse(&b[..20]), Bench::Other);
        let mut c = SeqCheck::default();
        for s in 0..7 {
            c.feed(Bench::Data(s));
        }
        assert!(c.feed(Bench::End(7)));
        assert!(c.complete());
        let mut d = SeqCheck::default();
        d.feed(Bench::Data(0));
        d.feed(Bench::Data(2));
        assert_eq!(d.seq_errors, 1);
        d.feed(Bench::Data(6));
        assert_eq!((d.seq_errors, d.missing, d.backward), (2, 4, 0));
        d.feed(Bench::Data(5));
        assert_eq!((d.seq_errors, d.missing, d.backward), (3, 4, 1));
        // frames 6..9 never came: the end marker says so
        assert!(d.feed(Bench::End(9)));
        assert_eq!((d.seq_errors, d.missing, d.data), (3, 7, 4));
    }
}
