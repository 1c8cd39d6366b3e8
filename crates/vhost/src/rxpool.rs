//! The receive buffers of pvnet's frontend: carved from chunks of its shared memory and, with
//! mergeable buffers, sized from an EWMA of the frames received (Linux `virtio_net`,
//! `get_mergeable_buf_len` and `mergeable_min_buf_len`).
//!
//! Each buffer is `[headroom | virtio-net header | frame]`: the device is given the buffer
//! from the header on; the headroom in front stays the driver's, so that a frame received in
//! place can grow at the front (an encapsulation) without a copy.
//!
//! Buffers are carved one after the other through the pool, wrapping at its end, so that
//! successive buffers are contiguous whatever their sizes (the device writes and the driver
//! reads them in that order). The pool is counted in chunks of [`CHUNK`] bytes, each with the
//! number of buffers overlapping it: carving may enter a chunk only when none does (a buffer
//! held longer, or returned out of order, makes the carving skip its chunk). Carved two to a
//! 4 KiB page instead, the rest of each page left over as Linux's page fragments do, 1514-byte
//! frames received in place went at half the rate (`docs/no-copy.md`, receive buffers).
//!
//! Sizes ([`RxBuffers`]):
//!
//! * `Fixed(n)`: every buffer offers `n` bytes to the device (header included); chunks are one
//!   buffer each, of `n` plus the headroom rounded up to a cache line.
//! * `Ewma`: a buffer offers `header + clamp(avg, floor, CHUNK - header)` bytes,
//!   rounded up to a cache line, where `avg` is an exponentially weighted moving average of
//!   the lengths of the frames received (weight 1/64 as in Linux, with 8 fractional bits so
//!   that it reaches the length it follows instead of stalling up to 63 bytes short), and
//!   `floor` is the smallest size at which a full ring still holds the largest frame the
//!   device may send (Linux clamps at 1518 bytes instead, so that 64-byte frames still take
//!   1.5 KiB each). It starts at 1514 bytes. 1500-byte frames take one buffer each, 64-byte
//!   frames 192 bytes each.
//!
//! Without `VIRTIO_NET_F_MRG_RXBUF` a frame must fit one buffer (virtio 1.x 5.1.6.3.1): every
//! buffer is then as large as the largest frame, whatever the mode.
//!
//! The pool is sized so that carving always finds room: see [`RxPool::new`].

use std::fmt;
use std::str::FromStr;

/// Bytes of a chunk that `Ewma` buffers are carved from.
pub(crate) const CHUNK: u32 = 4096;
/// Buffers start and end on a cache line.
pub(crate) const LINE: u32 = 64;
/// Default bytes reserved in front of each buffer's virtio-net header.
pub const DEFAULT_HEADROOM: u32 = 64;
/// The EWMA's weight is `1 / 2^WEIGHT_LOG2` (Linux: `RECEIVE_AVG_WEIGHT` 64).
const WEIGHT_LOG2: u32 = 6;
/// Fractional bits the EWMA keeps.
const FRAC: u32 = 8;
/// The frame length the EWMA starts from: an Ethernet frame with a 1500-byte payload.
const SEED: u32 = 1514;
/// Smallest `Fixed` buffer: the header and a minimal frame.
const MIN_FIXED: u32 = 64 + 12;
/// Largest `Fixed` buffer (the largest frame and its header fit in one).
const MAX_FIXED: u32 = 65536 + 64;

/// How receive buffers are sized (`--rx-buffers fixed:<bytes>|ewma`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxBuffers {
    /// Every buffer offers this many bytes, header included.
    Fixed(u32),
    /// Sized from an EWMA of received frame lengths (see the module docs).
    Ewma,
}

/// Why a receive buffer sizing (`fixed:<bytes>` or `ewma`) did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseRxBuffersError {
    /// Neither `fixed:` nor `ewma` (the text given).
    #[error("unknown receive buffers {0:?} (fixed:<bytes>, ewma)")]
    Unknown(String),
    /// `fixed:` without a number after it (the text after it).
    #[error("fixed:<bytes> needs a number of bytes, not {0:?}")]
    NotANumber(String),
    /// A fixed size that cannot hold a frame, or more than the largest frame needs.
    #[error("fixed receive buffers of {0} bytes: must be {MIN_FIXED}..={MAX_FIXED}")]
    OutOfRange(u32),
}

impl FromStr for RxBuffers {
    type Err = ParseRxBuffersError;
    fn from_str(s: &str) -> Result<Self, ParseRxBuffersError> {
        if s == "ewma" {
            return Ok(Self::Ewma);
        }
        let n = s
            .strip_prefix("fixed:")
            .ok_or_else(|| ParseRxBuffersError::Unknown(s.to_owned()))?;
        let n: u32 = n
            .parse()
            .map_err(|_| ParseRxBuffersError::NotANumber(n.to_owned()))?;
        if !(MIN_FIXED..=MAX_FIXED).contains(&n) {
            return Err(ParseRxBuffersError::OutOfRange(n));
        }
        Ok(Self::Fixed(n))
    }
}

impl fmt::Display for RxBuffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "fixed:{n}"),
            Self::Ewma => f.write_str("ewma"),
        }
    }
}

/// Exponentially weighted moving average of frame lengths, weight `1 / 2^WEIGHT_LOG2`, with
/// `FRAC` fractional bits (0: no sample yet).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ewma(u32);

impl Ewma {
    /// Adds a sample (the first one sets the average).
    #[inline]
    pub(crate) fn add(&mut self, len: u32) {
        let v = len.min(1 << 20) << FRAC;
        self.0 = if self.0 == 0 {
            v
        } else {
            ((self.0 << WEIGHT_LOG2) - self.0 + v) >> WEIGHT_LOG2
        };
    }

    /// The average, rounded up.
    #[inline]
    pub(crate) fn read(&self) -> u32 {
        self.0.div_ceil(1 << FRAC)
    }
}

fn align(x: u32) -> u32 {
    x.div_ceil(LINE) * LINE
}

/// One posted buffer: where its slot starts in the pool, what the device was offered.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Posted {
    /// Offset of the slot (its headroom) from the pool's start.
    pub off: u32,
    /// Bytes offered to the device (from the header on).
    pub len: u32,
    /// Bytes of the slot: headroom, offered bytes, padding to the line (its true size).
    pub slot: u32,
}

/// The receive pool's bookkeeping (the bytes themselves are in the frontend's memfd).
#[derive(Debug)]
pub(crate) struct RxPool {
    mode: RxBuffers,
    mrg: bool,
    headroom: u32,
    hdr_len: u32,
    /// `Ewma` clamps: smallest and largest frame part of a buffer.
    floor: u32,
    ceil: u32,
    /// Buffer size without mergeable buffers, or with `Fixed`.
    whole: u32,
    /// Buffers overlapping each chunk of the pool.
    refs: Vec<u16>,
    /// Bytes of the pool.
    end: u32,
    /// Where the next buffer is carved from, and the chunk that offset is in, once entered.
    pos: u32,
    entered: Option<u32>,
    /// What each descriptor id was posted with.
    pub posted: Vec<Posted>,
    pub ewma: Ewma,
}

impl RxPool {
    /// Bookkeeping for a ring of `queue_size` whose device may send frames of up to
    /// `max_frame` bytes behind a header of `hdr_len`.
    pub(crate) fn new(
        mode: RxBuffers,
        mrg: bool,
        headroom: u32,
        hdr_len: u32,
        queue_size: u16,
        max_frame: u32,
    ) -> Self {
        let headroom = align(headroom);
        let most = hdr_len + max_frame;
        // Linux `mergeable_min_buf_len`: a full ring holds the largest frame.
        let floor = most.div_ceil(u32::from(queue_size)).max(hdr_len) - hdr_len;
        let whole = match (mode, mrg) {
            (RxBuffers::Fixed(n), true) => n,
            _ => align(most),
        };
        // The largest `Ewma` buffer offers a chunk (Linux: a page less the header, which it
        // counts apart); a ring too short for that to hold the largest frame gets larger ones.
        let ceil = (CHUNK - hdr_len).max(floor);
        let biggest = match (mode, mrg) {
            (RxBuffers::Ewma, true) => align(hdr_len + ceil),
            _ => whole,
        };
        // Each buffer out pins the chunks it overlaps, at most `span`; with as many free
        // chunks again, a run of `span` free chunks is always there to carve the next one
        // from, however the buffers come back.
        let span = slot_of(headroom, biggest).div_ceil(CHUNK) + 1;
        let chunks = (usize::from(queue_size) + 1) * span as usize;
        // Until frames arrive, buffers are sized for a full Ethernet frame (so the first ones
        // are not split), as Linux's floor of 1518 bytes does.
        let mut ewma = Ewma::default();
        ewma.add(SEED.min(max_frame));
        Self {
            mode,
            mrg,
            headroom,
            hdr_len,
            floor,
            ceil,
            whole,
            refs: vec![0; chunks],
            // At most 32769 descriptors (and one) times 18 chunks of 4 KiB: under 4 GiB.
            end: u32::try_from(chunks * CHUNK as usize).expect("the receive pool fits 4 GiB"),
            pos: 0,
            entered: None,
            posted: vec![Posted::default(); usize::from(queue_size)],
            ewma,
        }
    }

    /// Bytes of memory the pool needs.
    pub(crate) fn bytes(&self) -> u64 {
        self.refs.len() as u64 * u64::from(CHUNK)
    }

    /// Bytes in front of the header of every buffer.
    pub(crate) fn headroom(&self) -> u32 {
        self.headroom
    }

    /// Bytes the next buffer offers the device.
    #[inline]
    pub(crate) fn next_len(&self) -> u32 {
        if self.mode == RxBuffers::Ewma && self.mrg {
            let avg = self.ewma.read().clamp(self.floor, self.ceil);
            align(self.hdr_len + avg)
        } else {
            self.whole
        }
    }

    /// Carves a buffer offering `len` bytes right after the last one, or, where a chunk
    /// ahead is still held, after that chunk; `None` if no room is left (never while at
    /// most one buffer per descriptor is out).
    #[inline]
    pub(crate) fn alloc(&mut self, len: u32) -> Option<Posted> {
        let slot = slot_of(self.headroom, len);
        // Most buffers end in the chunk being carved.
        if let Some(c) = self.entered {
            let end = self.pos + slot;
            if end <= (c + 1) * CHUNK {
                self.refs[c as usize] += 1;
                let off = self.pos;
                self.pos = end;
                return Some(Posted { off, len, slot });
            }
        }
        self.alloc_across(len, slot)
    }

    /// [`alloc`](Self::alloc) where the buffer enters a chunk.
    #[cold]
    #[inline(never)]
    fn alloc_across(&mut self, len: u32, slot: u32) -> Option<Posted> {
        let end_of_pool = self.end;
        // Each failed try moves past at least one chunk: a lap bounds the search.
        for _ in 0..=self.refs.len() {
            if self.pos + slot > end_of_pool {
                self.pos = 0;
                self.entered = None;
            }
            let (first, end) = (self.pos / CHUNK, (self.pos + slot - 1) / CHUNK + 1);
            // A chunk entered for the first time this lap must be free; the one being carved
            // holds only buffers before `pos`.
            let new = if self.entered == Some(first) {
                first + 1
            } else {
                first
            };
            if let Some(c) = (new..end).rev().find(|&c| self.refs[c as usize] != 0) {
                self.pos = (c + 1) * CHUNK;
                self.entered = None;
                continue;
            }
            for r in &mut self.refs[first as usize..end as usize] {
                *r += 1;
            }
            self.entered = Some(end - 1);
            let off = self.pos;
            self.pos += slot;
            return Some(Posted { off, len, slot });
        }
        None
    }

    /// Gives a buffer back.
    #[inline]
    pub(crate) fn release(&mut self, b: Posted) {
        let (first, last) = (b.off / CHUNK, (b.off + b.slot - 1) / CHUNK);
        self.refs[first as usize] -= 1;
        if last != first {
            for r in &mut self.refs[first as usize + 1..=last as usize] {
                *r -= 1;
            }
        }
    }

    /// Chunks no buffer holds (for tests).
    #[cfg(test)]
    fn free_chunks(&self) -> usize {
        self.refs.iter().filter(|&&r| r == 0).count()
    }
}

/// The bytes a buffer offering `len` takes: headroom and all, rounded up to a cache line, and
/// to an odd number of lines. Buffers are carved one after the other, so the slot is the stride
/// between them; a stride of an even number of lines (2 KiB, say) puts the first lines of
/// successive buffers into a fraction of the cache's sets, and those are the lines both sides
/// touch for every frame (`docs/no-copy.md` has 2048-byte slots against 1600-byte ones).
fn slot_of(headroom: u32, len: u32) -> u32 {
    let s = align(headroom + len);
    if (s / LINE).is_multiple_of(2) {
        s + LINE
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_modes() {
        assert_eq!("ewma".parse(), Ok(RxBuffers::Ewma));
        assert_eq!("fixed:4096".parse(), Ok(RxBuffers::Fixed(4096)));
        assert_eq!(RxBuffers::Fixed(1536).to_string(), "fixed:1536");
        for bad in [
            "",
            "fixed",
            "fixed:",
            "fixed:x",
            "fixed:10",
            "fixed:70000",
            "lru",
        ] {
            assert!(bad.parse::<RxBuffers>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_average_reaches_the_length_it_follows() {
        let mut e = Ewma::default();
        e.add(64);
        assert_eq!(e.read(), 64);
        for _ in 0..400 {
            e.add(1514);
        }
        // Within a few bytes (Linux's integer EWMA would stall 63 bytes short).
        assert!((1510..=1514).contains(&e.read()), "{}", e.read());
        for _ in 0..1000 {
            e.add(60);
        }
        assert!(e.read() <= 61, "{}", e.read());
    }

    #[test]
    fn ewma_sizes_follow_traffic_within_the_clamps() {
        let mut p = RxPool::new(RxBuffers::Ewma, true, 64, 12, 256, 65535 + 18);
        // The floor: 256 buffers hold the largest frame.
        assert!(256 * p.next_len() >= 12 + 65535 + 18);
        for _ in 0..400 {
            p.ewma.add(1514);
        }
        // A 1500-byte frame (1514 on the wire) and its header fit one buffer.
        assert!(
            p.next_len() >= 12 + 1514 && p.next_len() <= 1536,
            "{}",
            p.next_len()
        );
        for _ in 0..2000 {
            p.ewma.add(64);
        }
        let small = p.next_len();
        assert!(small <= 320, "{small}");
        for _ in 0..2000 {
            p.ewma.add(60000);
        }
        assert_eq!(p.next_len(), CHUNK);
        // A ring of 8 needs 8 KiB buffers to hold a 64 KiB frame: chunks grow to fit them.
        let mut p = RxPool::new(RxBuffers::Ewma, true, 64, 12, 8, 65535 + 18);
        p.ewma.add(64);
        assert!(8 * p.next_len() >= 12 + 65535 + 18);
        assert!(p.alloc(p.next_len()).is_some());
    }

    #[test]
    fn without_mergeable_buffers_every_buffer_holds_the_largest_frame() {
        let p = RxPool::new(RxBuffers::Ewma, false, 64, 10, 256, 1518);
        assert!(p.next_len() >= 10 + 1518);
        let p = RxPool::new(RxBuffers::Fixed(200), false, 64, 10, 256, 1518);
        assert!(p.next_len() >= 10 + 1518);
    }

    #[test]
    fn buffers_are_contiguous_and_skip_chunks_still_held() {
        let mut p = RxPool::new(RxBuffers::Ewma, true, 64, 12, 4, 1518);
        let all = p.free_chunks();
        // 960 offered + 64 headroom = 16 lines, padded to 17: 1088-byte slots, back to back.
        let a: Vec<Posted> = (0..4).map(|_| p.alloc(960).unwrap()).collect();
        assert!(a.iter().all(|b| b.slot == 1088));
        assert!(a.windows(2).all(|w| w[1].off == w[0].off + 1088));
        assert_eq!(p.free_chunks(), all - 2);
        for x in &a[..3] {
            p.release(*x);
        }
        // a[3] spans 3264..4352: it still holds chunks 0 and 1.
        assert_eq!(p.free_chunks(), all - 2);
        // Carve past a wrap: once wrapped, chunks 0 and 1 are skipped while a[3] holds them.
        let (mut out, mut wrapped, mut last) = (Vec::new(), false, 0);
        for _ in 0..100 {
            let b = p.alloc(960).unwrap();
            wrapped |= b.off < last;
            last = b.off;
            let overlaps = b.off < a[3].off + a[3].slot && a[3].off < b.off + b.slot;
            assert!(!overlaps, "{b:?} overlaps the held {:?}", a[3]);
            assert!(
                !wrapped || b.off >= 2 * CHUNK,
                "{b:?} carved from a held chunk"
            );
            out.push(b);
            if out.len() > 3 {
                p.release(out.remove(0));
            }
        }
        assert!(wrapped);
        p.release(a[3]);
        for b in out {
            p.release(b);
        }
        assert_eq!(p.free_chunks(), all);
    }

    #[test]
    fn a_full_ring_of_the_largest_buffers_always_finds_a_chunk() {
        let q = 8u16;
        let mut p = RxPool::new(RxBuffers::Ewma, true, 64, 12, q, 65553);
        p.ewma.add(60000);
        let mut out: Vec<Posted> = (0..q).map(|_| p.alloc(p.next_len()).unwrap()).collect();
        // Release in an order that leaves chunks half used, then refill, many times.
        for round in 0..200usize {
            let k = round % out.len();
            let b = out.swap_remove(k);
            p.release(b);
            p.ewma.add(if round % 3 == 0 { 64 } else { 3000 });
            out.push(p.alloc(p.next_len()).expect("a chunk is always free"));
            let mut spans: Vec<(u32, u32)> = out.iter().map(|b| (b.off, b.off + b.slot)).collect();
            spans.sort_unstable();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "slots overlap");
            assert!(spans.iter().all(|s| s.1 as u64 <= p.bytes()));
        }
    }

    #[test]
    fn fixed_buffers_are_carved_back_to_back_at_an_odd_number_of_lines() {
        let mut p = RxPool::new(RxBuffers::Fixed(1536), true, 64, 12, 4, 1518);
        assert_eq!(p.next_len(), 1536);
        let a = p.alloc(1536).unwrap();
        let b = p.alloc(1536).unwrap();
        assert_eq!((a.slot, b.off - a.off), (1600, 1600));
        // 1984 + 64 = 32 lines: padded to 33.
        let mut p = RxPool::new(RxBuffers::Fixed(1984), true, 64, 12, 4, 1518);
        assert_eq!(p.alloc(1984).unwrap().slot, 2112);
    }
}
