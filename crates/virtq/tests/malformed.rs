//! One test per validation rule: a hostile driver (or, for the driver role, a hostile device)
//! corrupts the shared ring through [`MockQueue::poke`], and the queue must return the exact
//! [`Error`] variant without panicking.
//!
//! Ring layout (virtio 1.x 2.7, little endian): the descriptor table at `mq.addrs.desc`
//! (16-byte entries: addr u64, len u32, flags u16, next u16), the avail ring at
//! `mq.addrs.avail` (flags u16, idx u16, ring[size] u16, used_event u16), the used ring at
//! `mq.addrs.used` (flags u16, idx u16, ring[size] (id u32, len u32), avail_event u16).
//!
//! What happens after an error (checked by [`assert_sticky`] and [`assert_used_sticky`]):
//! * device: `available()` with a bad `avail->idx` fails without moving anything, every time.
//!   A chain that fails to parse is not consumed: `last_avail` stays on it, every further
//!   `pop()` in the batch returns the same error, and so does the first `pop()` of every later
//!   batch. Chains popped before it in the batch stay valid. Nothing is skipped silently.
//! * driver: a bad `used->idx` fails `used_available()` (and `arm_used_notify()`) every time;
//!   a bad used entry is not consumed: `pop_used()` keeps returning the same error and the free
//!   list, the in-flight count and the entries before it are unchanged.
//! * the one case where `pop()` returns `Ok(None)` before the end of a batch is a full
//!   segment scratch (4 x size segments per batch): the batch ends early and the next
//!   `available()` resumes at the same chain (see `scratch_full_rolls_back_without_loss`).
//!   A failed parse used to leave its partial segments in the scratch, so retried `pop()`s
//!   filled it and the error turned into that `Ok(None)`; `assert_sticky` retries more often
//!   than the scratch holds to keep that fixed.

use std::sync::Arc;
use virtq::mock::{MockQueue, OwnedMem, GPA_BASE};
use virtq::split::{
    Buf, DeviceQueue, Direction, DriverQueue, QueueConfig, RingAddrs, DESC_F_INDIRECT, DESC_F_NEXT,
    DESC_F_WRITE,
};
use virtq::{read_segs, AddrSpace};
use virtq::{Error, MemTable, Perm, RegionSpec, Translate};

const SIZE: u16 = 8;
const BUF: u32 = 256;
const R: u16 = 0;
const W: u16 = DESC_F_WRITE;
const N: u16 = DESC_F_NEXT;
const I: u16 = DESC_F_INDIRECT;

/// One descriptor as 16 little-endian bytes.
fn desc_bytes(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[12..14].copy_from_slice(&flags.to_le_bytes());
    b[14..16].copy_from_slice(&next.to_le_bytes());
    b
}

/// Writes the shared ring the way a peer that ignores the rules would.
struct Hostile<'a> {
    mq: &'a MockQueue,
}

impl Hostile<'_> {
    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = self.mq.addrs.desc + 16 * u64::from(i);
        self.mq.poke(at, &desc_bytes(addr, len, flags, next));
    }

    /// An indirect table at `gpa`.
    fn table(&self, gpa: u64, entries: &[(u64, u32, u16, u16)]) {
        let mut v = Vec::new();
        for &(addr, len, flags, next) in entries {
            v.extend_from_slice(&desc_bytes(addr, len, flags, next));
        }
        self.mq.poke(gpa, &v);
    }

    fn avail(&self, slot: u16, head: u16) {
        let at = self.mq.addrs.avail + 4 + 2 * u64::from(slot % self.mq.size);
        self.mq.poke(at, &head.to_le_bytes());
    }

    fn avail_idx(&self, idx: u16) {
        self.mq.poke(self.mq.addrs.avail + 2, &idx.to_le_bytes());
    }

    /// Offers chains with these heads in avail slots 0.. and sets `avail->idx`.
    fn offer(&self, heads: &[u16]) {
        for (slot, &h) in heads.iter().enumerate() {
            self.avail(u16::try_from(slot).expect("small"), h);
        }
        self.avail_idx(u16::try_from(heads.len()).expect("small"));
    }

    fn used(&self, slot: u16, id: u32, len: u32) {
        let at = self.mq.addrs.used + 4 + 8 * u64::from(slot % self.mq.size);
        let mut b = [0u8; 8];
        b[0..4].copy_from_slice(&id.to_le_bytes());
        b[4..8].copy_from_slice(&len.to_le_bytes());
        self.mq.poke(at, &b);
    }

    fn used_idx(&self, idx: u16) {
        self.mq.poke(self.mq.addrs.used + 2, &idx.to_le_bytes());
    }
}

fn mock() -> MockQueue {
    MockQueue::new(SIZE, BUF)
}

/// A device queue over the mock's (zeroed) rings: no driver, the test is the driver.
fn device(mq: &MockQueue, dir: Direction, indirect: bool) -> DeviceQueue {
    DeviceQueue::new(mq.mem.clone(), &mq.config(dir, false, indirect)).expect("device queue")
}

/// The chain at the device's next avail slot fails with `want`, and keeps failing the same
/// way: within the batch, and in a fresh batch. `last_avail` never moves past it.
#[track_caller]
fn assert_sticky(dev: &mut DeviceQueue, want: Error) {
    let at = dev.last_avail();
    let pending = dev.pending();
    assert!(pending > 0, "test must offer the bad chain");
    // More retries than the segment scratch holds (4 * size), so that leftovers of a failed
    // parse would show up.
    for k in 0..(8 * usize::from(dev.size()) + 4) {
        assert_eq!(dev.pop(), Err(want), "pop retry {k}");
        assert_eq!(dev.last_avail(), at, "the bad chain is not consumed");
        assert_eq!(dev.pending(), pending);
    }
    for k in 0..3 {
        assert!(dev.available().expect("avail idx is fine") > 0);
        assert_eq!(dev.pop(), Err(want), "new batch {k}");
        assert_eq!(dev.last_avail(), at);
    }
}

/// Offers `heads`, starts a batch, pops `good` valid chains, then expects `want` (sticky).
#[track_caller]
fn expect_pop_err(dev: &mut DeviceQueue, h: &Hostile, heads: &[u16], good: usize, want: Error) {
    h.offer(heads);
    assert_eq!(
        dev.available(),
        Ok(u16::try_from(heads.len()).expect("small"))
    );
    for _ in 0..good {
        assert!(dev.pop().expect("valid chain").is_some());
    }
    assert_sticky(dev, want);
}

// ---------------------------------------------------------------- device: the avail ring

#[test]
fn avail_idx_jump_beyond_size() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.avail_idx(SIZE + 1);
    let want = Error::AvailIdxJump {
        last: 0,
        idx: SIZE + 1,
        size: SIZE,
    };
    for _ in 0..3 {
        assert_eq!(dev.available(), Err(want));
        assert_eq!(dev.pending(), 0, "nothing was taken from the bad index");
        assert_eq!(dev.pop(), Ok(None));
        assert_eq!(dev.last_avail(), 0);
    }
    assert_eq!(dev.arm_notify(), Err(want), "arm re-check reports it too");
    // A "backwards" index is a jump of almost 2^16.
    h.avail_idx(0xffff);
    assert_eq!(
        dev.available(),
        Err(Error::AvailIdxJump {
            last: 0,
            idx: 0xffff,
            size: SIZE
        })
    );
    // Exactly `size` is fine.
    for i in 0..SIZE {
        h.desc(i, mq.buf(i), 16, R, 0);
        h.avail(i, i);
    }
    h.avail_idx(SIZE);
    assert_eq!(dev.available(), Ok(SIZE));
}

#[test]
fn head_index_out_of_range() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(0, mq.buf(0), 16, R, 0);
    let want = Error::DescIndexOutOfRange {
        index: SIZE,
        size: SIZE,
    };
    expect_pop_err(&mut dev, &h, &[0, SIZE], 1, want);
    let want = Error::DescIndexOutOfRange {
        index: 0xffff,
        size: SIZE,
    };
    h.avail(1, 0xffff);
    assert_sticky(&mut dev, want);
}

#[test]
fn next_index_out_of_range() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(0, mq.buf(0), 16, R | N, 1);
    h.desc(1, mq.buf(1), 16, R | N, SIZE);
    let want = Error::DescIndexOutOfRange {
        index: SIZE,
        size: SIZE,
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
    // Without F_NEXT the `next` field is ignored, whatever it holds.
    h.desc(1, mq.buf(1), 16, R, 0xffff);
    assert_eq!(dev.available(), Ok(1));
    let c = dev.pop().expect("valid").expect("chain");
    assert_eq!(c.readable, 32);
}

#[test]
fn chain_loop_to_itself() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(0, mq.buf(0), 16, R | N, 0);
    let want = Error::ChainTooLong {
        max: u32::from(SIZE),
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
}

#[test]
fn chain_cycle() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(3, mq.buf(0), 16, R, 0);
    // 0 -> 1 -> 2 -> 1 -> ...
    h.desc(0, mq.buf(0), 16, R | N, 1);
    h.desc(1, mq.buf(1), 16, R | N, 2);
    h.desc(2, mq.buf(2), 16, R | N, 1);
    let want = Error::ChainTooLong {
        max: u32::from(SIZE),
    };
    // A good chain first, so the failing parse starts mid-scratch.
    expect_pop_err(&mut dev, &h, &[3, 0], 1, want);
}

/// Every descriptor of the table in one chain, and the last one points back to the first:
/// the chain is longer than the queue.
#[test]
fn chain_longer_than_queue() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    for i in 0..SIZE {
        h.desc(i, mq.buf(i), 16, R | N, (i + 1) % SIZE);
    }
    let want = Error::ChainTooLong {
        max: u32::from(SIZE),
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
    // All `size` descriptors without the loop is the longest legal chain.
    h.desc(SIZE - 1, mq.buf(SIZE - 1), 16, R, 0);
    assert_eq!(dev.available(), Ok(1));
    let c = dev.pop().expect("legal").expect("chain");
    assert_eq!(c.readable, 16 * u32::from(SIZE));
    assert_eq!(dev.readable(&c).len(), usize::from(SIZE));
}

/// Direct descriptors plus an indirect table: the whole chain exceeds the queue size even
/// though neither part does.
#[test]
fn chain_longer_than_queue_via_indirect() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, true);
    let t = mq.buf(7);
    let entries: Vec<_> = (0..SIZE)
        .map(|k| (mq.buf(0), 4, R | if k + 1 < SIZE { N } else { 0 }, k + 1))
        .collect();
    h.table(t, &entries);
    h.desc(0, mq.buf(1), 16, R | N, 1);
    h.desc(1, t, 16 * u32::from(SIZE), I, 0);
    let want = Error::ChainTooLong {
        max: u32::from(SIZE),
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
    // The same table straight from the head is legal (head + size entries).
    h.offer(&[1]);
    assert_eq!(dev.available(), Ok(1));
    let c = dev.pop().expect("legal").expect("chain");
    assert_eq!(c.readable, 4 * u32::from(SIZE));
}

#[test]
fn length_overflow() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    // A mapped descriptor, then one whose length overflows the chain's u32 total: the
    // length check comes before translation, so the second one is never translated.
    h.desc(0, mq.buf(0), 16, R | N, 1);
    h.desc(1, mq.buf(1), 0xffff_ffff, R, 0);
    expect_pop_err(&mut dev, &h, &[0], 0, Error::LenOverflow);
}

/// Two descriptors of 0xffff_ffff bytes: the first cannot be mapped (the mock region is
/// small), so the chain fails at the end of the region, inside the first one, before its
/// length can overflow. The error names the first byte that is not mapped.
#[test]
fn length_overflow_two_max_descs() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(0, mq.buf(0), 0xffff_ffff, R | N, 1);
    h.desc(1, mq.buf(1), 0xffff_ffff, R, 0);
    let end = GPA_BASE + mq.len;
    let want = Error::AddrNotMapped {
        addr: end,
        len: 0xffff_ffff - (end - mq.buf(0)),
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
}

/// Readable and writable totals each fit, their sum does not.
#[test]
fn length_overflow_readable_plus_writable() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::Mixed, false);
    h.desc(0, mq.buf(0), 16, R | N, 1);
    h.desc(1, mq.buf(1), 0xffff_fff0, W, 0);
    expect_pop_err(&mut dev, &h, &[0], 0, Error::LenOverflow);
}

#[test]
fn address_outside_any_region() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(0, 0, 64, R, 0);
    expect_pop_err(
        &mut dev,
        &h,
        &[0],
        0,
        Error::AddrNotMapped { addr: 0, len: 64 },
    );
    let end = GPA_BASE + mq.len;
    h.desc(0, end, 1, R, 0);
    assert_sticky(&mut dev, Error::AddrNotMapped { addr: end, len: 1 });
    h.desc(0, u64::MAX, 1, R, 0);
    assert_sticky(
        &mut dev,
        Error::AddrNotMapped {
            addr: u64::MAX,
            len: 1,
        },
    );
    // Mid-chain, after a good descriptor.
    h.desc(0, mq.buf(0), 64, R | N, 1);
    h.desc(1, GPA_BASE - 64, 64, R, 0);
    assert_sticky(
        &mut dev,
        Error::AddrNotMapped {
            addr: GPA_BASE - 64,
            len: 64,
        },
    );
}

#[test]
fn address_plus_len_crosses_region_end() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    let last = GPA_BASE + mq.len - 8;
    h.desc(0, last, 16, R, 0);
    expect_pop_err(
        &mut dev,
        &h,
        &[0],
        0,
        Error::AddrNotMapped {
            addr: GPA_BASE + mq.len,
            len: 8,
        },
    );
    // Ending exactly at the end is fine.
    h.desc(0, last, 8, R, 0);
    assert_eq!(dev.available(), Ok(1));
    assert_eq!(dev.pop().expect("fits").expect("chain").readable, 8);
}

/// A descriptor before the region start whose end reaches into it is still unmapped.
#[test]
fn address_starts_before_region() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(0, GPA_BASE - 8, 16, R, 0);
    let want = Error::AddrNotMapped {
        addr: GPA_BASE - 8,
        len: 16,
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
}

#[test]
fn writable_descriptor_on_device_reads_queue() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    h.desc(0, mq.buf(0), 16, R | N, 1);
    h.desc(1, mq.buf(1), 16, W, 0);
    let want = Error::DirectionMismatch {
        found: "writable",
        queue: "device-reads",
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
}

/// The write flag on an indirect table's entry, on a queue the device only reads, is ignored
/// and counted (DPDK's packed transmit tables carry it on their header entry; the split ring
/// takes the same rule): the chain is taken, its bytes all readable. A writable descriptor in
/// the ring itself is still refused (above).
#[test]
fn write_flag_in_an_indirect_table_on_device_reads_queue_is_ignored() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let t = mq.buf(7);
    let mut dev = device(&mq, Direction::DeviceReads, true);
    mq.poke(mq.buf(0), &[1; 12]);
    mq.poke(mq.buf(1), &[2; 64]);
    h.table(t, &[(mq.buf(0), 12, W | N, 1), (mq.buf(1), 64, R, 0)]);
    h.desc(0, t, 32, I, 0);
    h.offer(&[0]);
    assert_eq!(dev.available(), Ok(1));
    let c = dev.pop().expect("taken").expect("a chain");
    assert_eq!((c.head, c.readable, c.writable), (0, 76, 0));
    let mut got = [0u8; 76];
    read_segs(dev.readable(&c), 0, &mut got);
    assert!(got[..12] == [1; 12] && got[12..] == [2; 64]);
    assert_eq!(dev.take_write_ignored(), 1);
}

#[test]
fn readable_descriptor_on_device_writes_queue() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceWrites, false);
    h.desc(0, mq.buf(0), 16, W | N, 1);
    h.desc(1, mq.buf(1), 16, R, 0);
    let want = Error::DirectionMismatch {
        found: "readable",
        queue: "device-writes",
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
}

#[test]
fn readable_after_writable_on_mixed_queue() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::Mixed, false);
    // Legal control-queue shape first: readable, readable, writable.
    h.desc(0, mq.buf(0), 16, R | N, 1);
    h.desc(1, mq.buf(1), 16, R | N, 2);
    h.desc(2, mq.buf(2), 32, W, 0);
    // Then readable, writable, readable.
    h.desc(3, mq.buf(3), 16, R | N, 4);
    h.desc(4, mq.buf(4), 16, W | N, 5);
    h.desc(5, mq.buf(5), 16, R, 0);
    h.offer(&[0, 3]);
    assert_eq!(dev.available(), Ok(2));
    let c = dev.pop().expect("legal").expect("chain");
    assert_eq!((c.readable, c.writable), (32, 32));
    assert_eq!((dev.readable(&c).len(), dev.writable(&c).len()), (2, 1));
    assert_sticky(&mut dev, Error::ReadableAfterWritable);
}

/// A hostile driver offers the same long chain in every avail slot, so one batch holds more
/// segments than the scratch (4 * size). `pop` stops the batch early with `Ok(None)` and the
/// rest comes in the next batch: nothing is lost or skipped.
#[test]
fn scratch_full_rolls_back_without_loss() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    for i in 0..SIZE {
        let (f, next) = if i + 1 < SIZE { (R | N, i + 1) } else { (R, 0) };
        h.desc(i, mq.buf(i), 16, f, next);
    }
    h.offer(&[0; SIZE as usize]);
    let mut got = 0;
    let mut batches = 0;
    while got < SIZE {
        let n = dev.available().expect("valid idx");
        assert_eq!(n, SIZE - got);
        batches += 1;
        while let Some(c) = dev.pop().expect("legal chain") {
            assert_eq!((c.head, c.readable), (0, 16 * u32::from(SIZE)));
            assert_eq!(dev.readable(&c).len(), usize::from(SIZE));
            got += 1;
        }
        assert_eq!(dev.last_avail(), got);
    }
    // 8 segments per chain, 32 in the scratch: 4 chains per batch.
    assert_eq!(batches, 2);
}

/// A loop in a chain that starts mid-batch can hit the full scratch before its length
/// bound: the batch ends with `Ok(None)` and the next batch reports the loop.
#[test]
fn loop_mid_batch_reported_next_batch() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    for i in 0..4 {
        let (f, next) = if i + 1 < 4 { (R | N, i + 1) } else { (R, 0) };
        h.desc(i, mq.buf(i), 16, f, next);
    }
    h.desc(4, mq.buf(4), 16, R | N, 4);
    // 7 chains of 4 segments (28), then the loop: it fills the last 4 slots and overflows.
    h.offer(&[0, 0, 0, 0, 0, 0, 0, 4]);
    assert_eq!(dev.available(), Ok(8));
    for _ in 0..7 {
        assert!(dev.pop().expect("legal").is_some());
    }
    assert_eq!(dev.pop(), Ok(None), "scratch full: batch ends");
    assert_eq!(dev.last_avail(), 7);
    assert_eq!(dev.available(), Ok(1));
    assert_sticky(
        &mut dev,
        Error::ChainTooLong {
            max: u32::from(SIZE),
        },
    );
}

// ---------------------------------------------------------------- device: indirect tables

#[test]
fn indirect_accepted_when_valid() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::Mixed, true);
    let t = mq.buf(7);
    mq.poke(mq.buf(0), b"hello ");
    mq.poke(mq.buf(1), b"world");
    // Table order differs from chain order: entry 0 -> 2 -> 1.
    h.table(
        t,
        &[
            (mq.buf(0), 6, R | N, 2),
            (mq.buf(3), 64, W, 0),
            (mq.buf(1), 5, R | N, 1),
        ],
    );
    h.desc(0, t, 48, I, 0);
    h.offer(&[0]);
    assert_eq!(dev.available(), Ok(1));
    let c = dev.pop().expect("valid").expect("chain");
    assert_eq!((c.head, c.readable, c.writable), (0, 11, 64));
    let mut b = [0u8; 11];
    assert_eq!(read_segs(dev.readable(&c), 0, &mut b), 11);
    assert_eq!(&b, b"hello world");
}

#[test]
fn indirect_not_negotiated() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, false);
    let t = mq.buf(7);
    h.table(t, &[(mq.buf(0), 16, R, 0)]);
    h.desc(0, t, 16, I, 0);
    expect_pop_err(&mut dev, &h, &[0], 0, Error::IndirectNotNegotiated);
}

#[test]
fn indirect_with_next() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, true);
    let t = mq.buf(7);
    h.table(t, &[(mq.buf(0), 16, R, 0)]);
    h.desc(0, t, 16, I | N, 1);
    h.desc(1, mq.buf(1), 16, R, 0);
    expect_pop_err(&mut dev, &h, &[0], 0, Error::IndirectNested);
}

#[test]
fn indirect_nested() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, true);
    let (t, t2) = (mq.buf(7), mq.buf(6));
    h.table(t2, &[(mq.buf(0), 16, R, 0)]);
    h.table(t, &[(mq.buf(1), 16, R | N, 1), (t2, 16, I, 0)]);
    h.desc(0, t, 32, I, 0);
    expect_pop_err(&mut dev, &h, &[0], 0, Error::IndirectNested);
    // An indirect table pointing at itself.
    h.table(t, &[(t, 16, I, 0)]);
    h.desc(0, t, 16, I, 0);
    assert_sticky(&mut dev, Error::IndirectNested);
}

#[test]
fn indirect_bad_length() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, true);
    let t = mq.buf(7);
    let entries: Vec<_> = (0..=SIZE).map(|_| (mq.buf(0), 1, R, 0)).collect();
    h.table(t, &entries);
    h.offer(&[0]);
    assert_eq!(dev.available(), Ok(1));
    let too_big = 16 * (u32::from(SIZE) + 1);
    for len in [0, 8, 24, 17, too_big, 0xffff_fff0] {
        h.desc(0, t, len, I, 0);
        assert_sticky(&mut dev, Error::IndirectBadLen { len });
    }
    // A table of exactly `size` entries is fine.
    h.desc(0, t, 16 * u32::from(SIZE), I, 0);
    assert_eq!(dev.pop().expect("legal").expect("chain").readable, 1);
}

#[test]
fn indirect_table_outside_memory() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, true);
    h.desc(0, 0, 32, I, 0);
    expect_pop_err(
        &mut dev,
        &h,
        &[0],
        0,
        Error::AddrNotMapped { addr: 0, len: 32 },
    );
    // Starting inside, ending past the region: the first byte past it is named.
    let last = GPA_BASE + mq.len - 16;
    h.desc(0, last, 32, I, 0);
    assert_sticky(
        &mut dev,
        Error::AddrNotMapped {
            addr: last + 16,
            len: 16,
        },
    );
}

#[test]
fn indirect_entry_next_out_of_range() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, true);
    let t = mq.buf(7);
    // A table of 2 entries whose first entry links to entry 2.
    h.table(t, &[(mq.buf(0), 16, R | N, 2), (mq.buf(1), 16, R, 0)]);
    h.desc(0, t, 32, I, 0);
    let want = Error::DescIndexOutOfRange { index: 2, size: 2 };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
}

#[test]
fn indirect_loop() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let mut dev = device(&mq, Direction::DeviceReads, true);
    let t = mq.buf(7);
    h.table(t, &[(mq.buf(0), 16, R | N, 1), (mq.buf(1), 16, R | N, 0)]);
    h.desc(0, t, 32, I, 0);
    let want = Error::ChainTooLong {
        max: u32::from(SIZE),
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
}

#[test]
fn indirect_entries_checked_like_direct_ones() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let t = mq.buf(7);
    let mut dev = device(&mq, Direction::DeviceWrites, true);
    h.table(t, &[(mq.buf(0), 16, W | N, 1), (mq.buf(1), 16, R, 0)]);
    h.desc(0, t, 32, I, 0);
    let want = Error::DirectionMismatch {
        found: "readable",
        queue: "device-writes",
    };
    expect_pop_err(&mut dev, &h, &[0], 0, want);
    h.table(t, &[(mq.buf(0), 16, W | N, 1), (0, 16, W, 0)]);
    assert_sticky(&mut dev, Error::AddrNotMapped { addr: 0, len: 16 });
    h.table(
        t,
        &[(mq.buf(0), 16, W | N, 1), (mq.buf(1), 0xffff_fff8, W, 0)],
    );
    assert_sticky(&mut dev, Error::LenOverflow);
}

// ---------------------------------------------------------------- device: configuration

#[test]
fn bad_queue_config() {
    let mq = mock();
    let base = mq.config(Direction::DeviceReads, false, false);
    for size in [0u16, 3, 6, 0xffff] {
        let cfg = QueueConfig { size, ..base };
        assert_eq!(
            DeviceQueue::new(mq.mem.clone(), &cfg).map(|_| ()),
            Err(Error::BadQueueSize(u32::from(size)))
        );
        assert_eq!(
            DriverQueue::new(mq.mem.clone(), &cfg).map(|_| ()),
            Err(Error::BadQueueSize(u32::from(size)))
        );
    }
    let a = mq.addrs;
    for (addrs, part, addr) in [
        (
            RingAddrs {
                desc: a.desc + 8,
                ..a
            },
            "desc",
            a.desc + 8,
        ),
        (
            RingAddrs {
                avail: a.avail + 1,
                ..a
            },
            "avail",
            a.avail + 1,
        ),
        (
            RingAddrs {
                used: a.used + 2,
                ..a
            },
            "used",
            a.used + 2,
        ),
    ] {
        let cfg = QueueConfig { addrs, ..base };
        assert_eq!(
            DeviceQueue::new(mq.mem.clone(), &cfg).map(|_| ()),
            Err(Error::RingMisaligned { part, addr })
        );
    }
    // A used ring that runs past the end of the region.
    let used = GPA_BASE + mq.len - 16;
    let cfg = QueueConfig {
        addrs: RingAddrs { used, ..a },
        ..base
    };
    assert_eq!(
        DeviceQueue::new(mq.mem.clone(), &cfg).map(|_| ()),
        Err(Error::AddrNotMapped {
            addr: used,
            len: 6 + 8 * u64::from(SIZE)
        })
    );
    // User-space addresses are looked up in the user address space.
    let cfg = QueueConfig {
        space: AddrSpace::User,
        ..base
    };
    assert!(matches!(
        DeviceQueue::new(mq.mem.clone(), &cfg),
        Err(Error::AddrNotMapped { .. })
    ));
}

#[test]
fn bad_regions() {
    let m = OwnedMem::new(0x3000);
    let p = m.as_ptr();
    let spec = |gpa, len, uaddr| RegionSpec {
        gpa,
        len,
        uaddr,
        host: p,
    };
    let new = |specs: &[RegionSpec]| {
        // SAFETY: every region below lies inside the 0x3000 bytes of `m`, which outlives the
        // tables; no table is used to access memory.
        unsafe { MemTable::new(specs, Box::new(())) }.map(|_| ())
    };
    assert_eq!(
        new(&[spec(0x1000, 0, 0)]),
        Err(Error::BadRegion {
            index: 0,
            why: "empty"
        })
    );
    assert_eq!(
        new(&[spec(u64::MAX - 0xfff, 0x1000, 0)]),
        Err(Error::BadRegion {
            index: 0,
            why: "guest range wraps"
        })
    );
    assert_eq!(
        new(&[spec(0, 0x1000, u64::MAX - 0xfff)]),
        Err(Error::BadRegion {
            index: 0,
            why: "user range wraps"
        })
    );
    assert_eq!(
        new(&[spec(0x2000, 0x1000, 0), spec(0x1000, 0x1001, 0x10000)]),
        Err(Error::BadRegion {
            index: 1,
            why: "overlaps another region"
        })
    );
    assert_eq!(
        new(&[spec(0x1000, 0x1000, 0x5000), spec(0x2000, 0x1000, 0x5fff)]),
        Err(Error::BadRegion {
            index: 1,
            why: "user range overlaps another region"
        })
    );
    assert_eq!(
        new(&[spec(0x1000, 0x1000, 0), spec(0x2000, 0x1000, 0x1000)]),
        Ok(())
    );
}

/// Three regions: A holds the rings, B is gpa-adjacent to A but elsewhere in host memory, C
/// is after a gap. A buffer spanning A|B becomes two segments; one spanning B|gap fails.
#[test]
fn buffers_across_regions() {
    const A: u64 = 0x10_0000;
    const B: u64 = A + 0x4000;
    const C: u64 = B + 0x2000;
    let (ma, mb, mc) = (
        OwnedMem::new(0x4000),
        OwnedMem::new(0x1000),
        OwnedMem::new(0x1000),
    );
    let specs = [
        RegionSpec {
            gpa: A,
            len: 0x4000,
            uaddr: 0x7000_0000,
            host: ma.as_ptr(),
        },
        RegionSpec {
            gpa: C,
            len: 0x1000,
            uaddr: 0x9000_0000,
            host: mc.as_ptr(),
        },
        RegionSpec {
            gpa: B,
            len: 0x1000,
            uaddr: 0x8000_0000,
            host: mb.as_ptr(),
        },
    ];
    // SAFETY: each region is exactly one owned allocation, moved into the table's owner.
    let mem = unsafe { MemTable::new(&specs, Box::new((ma, mb, mc))) }.expect("valid table");
    let mem = Arc::new(mem);
    let addrs = RingAddrs {
        desc: A,
        avail: A + 0x1000,
        used: A + 0x2000,
    };
    let cfg = QueueConfig {
        format: virtq::Format::Split,
        size: SIZE,
        addrs,
        space: AddrSpace::Guest,
        base: 0,
        event_idx: false,
        indirect: false,
        in_order: false,
        direction: Direction::DeviceReads,
    };
    let mut drv = DriverQueue::new(mem.clone(), &cfg).expect("driver");
    let mut dev = DeviceQueue::new(mem.clone(), &cfg).expect("device");
    // Write a pattern across A's end and B's start through the device's own translation.
    let span = B - 16;
    drv.add_one(Buf {
        addr: span,
        len: 32,
        write: false,
    })
    .expect("free");
    drv.add_one(Buf {
        addr: B + 0x1000 - 16,
        len: 32,
        write: false,
    })
    .expect("free");
    assert!(drv.publish());
    assert_eq!(dev.available(), Ok(2));
    let c = dev.pop().expect("two regions, no gap").expect("chain");
    assert_eq!(c.readable, 32);
    let segs = dev.readable(&c);
    assert_eq!(segs.len(), 2, "split at the region boundary");
    assert_eq!((segs[0].len(), segs[1].len()), (16, 16));
    let data: Vec<u8> = (0..32).collect();
    assert_eq!(virtq::write_segs(segs, 0, &data), 32);
    let mut back = [0u8; 32];
    assert_eq!(read_segs(segs, 0, &mut back), 32);
    assert_eq!(&back[..], &data[..]);
    assert_sticky(
        &mut dev,
        Error::AddrNotMapped {
            addr: B + 0x1000,
            len: 16,
        },
    );
    // Translation hint: hit, miss and a gap.
    let mut hint = 0;
    assert!(mem.translate(C + 5, Perm::Read, &mut hint).is_ok());
    assert_eq!(
        mem.translate(C + 5, Perm::Read, &mut hint)
            .ok()
            .map(|t| t.1),
        Some(0x1000 - 5)
    );
    assert!(mem.translate(B + 0x1000, Perm::Read, &mut hint).is_err());
    assert!(mem.translate(A - 1, Perm::Read, &mut hint).is_err());
    assert!(mem.translate(C + 0x1000, Perm::Read, &mut hint).is_err());
}

// ---------------------------------------------------------------- driver: hostile device

/// A driver with `n` one-descriptor buffers published (device-writable, BUF bytes each).
fn driver_with(mq: &MockQueue, n: u16, write: bool) -> (DriverQueue, Vec<u16>) {
    let dir = if write {
        Direction::DeviceWrites
    } else {
        Direction::DeviceReads
    };
    let (mut drv, _dev) = mq.pair(dir, false).expect("pair");
    let ids = (0..n)
        .map(|i| {
            drv.add_one(Buf {
                addr: mq.buf(i),
                len: BUF,
                write,
            })
            .expect("free")
        })
        .collect();
    assert!(drv.publish());
    (drv, ids)
}

/// The next used entry fails with `want` and keeps failing; nothing is freed.
#[track_caller]
fn assert_used_sticky(drv: &mut DriverQueue, want: Error) {
    let (free, in_flight) = (drv.free_count(), drv.in_flight());
    for k in 0..3 {
        assert_eq!(drv.pop_used(), Err(want), "pop_used retry {k}");
        assert_eq!((drv.free_count(), drv.in_flight()), (free, in_flight));
    }
    for k in 0..3 {
        assert!(drv.used_available().expect("used idx is fine") > 0);
        assert_eq!(drv.pop_used(), Err(want), "new batch {k}");
        assert_eq!((drv.free_count(), drv.in_flight()), (free, in_flight));
    }
}

#[test]
fn used_id_out_of_range() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let (mut drv, _) = driver_with(&mq, 2, true);
    for id in [u32::from(SIZE), 0xffff, 0x1_0000, u32::MAX] {
        h.used(0, id, 0);
        h.used_idx(1);
        assert_eq!(drv.used_available(), Ok(1));
        assert_used_sticky(&mut drv, Error::UsedIdInvalid { id });
    }
}

#[test]
fn used_id_not_in_flight() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let (mut drv, ids) = driver_with(&mq, 2, true);
    let free_id = (0..SIZE).find(|i| !ids.contains(i)).expect("a free id");
    h.used(0, u32::from(free_id), 0);
    h.used_idx(1);
    assert_eq!(drv.used_available(), Ok(1));
    assert_used_sticky(
        &mut drv,
        Error::UsedIdInvalid {
            id: u32::from(free_id),
        },
    );
    // The same id twice: the first is fine, the second is no longer in flight.
    h.used(0, u32::from(ids[0]), 1);
    h.used(1, u32::from(ids[0]), 1);
    h.used_idx(2);
    assert_eq!(drv.used_available(), Ok(2));
    assert_eq!(drv.pop_used(), Ok(Some((ids[0], 1))));
    assert_used_sticky(
        &mut drv,
        Error::UsedIdInvalid {
            id: u32::from(ids[0]),
        },
    );
}

/// The second descriptor of a chain is in flight, but it is not a head.
#[test]
fn used_id_not_a_head() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let (mut drv, _dev) = mq.pair(Direction::DeviceWrites, false).expect("pair");
    let b = |i| Buf {
        addr: mq.buf(i),
        len: 64,
        write: true,
    };
    let head = drv.add_chain(&[b(0), b(1), b(2)]).expect("free");
    assert!(drv.publish());
    let mut d = [0u8; 16];
    mq.peek(mq.addrs.desc + 16 * u64::from(head), &mut d);
    let second = u16::from_le_bytes([d[14], d[15]]);
    assert_ne!(second, head);
    h.used(0, u32::from(second), 0);
    h.used_idx(1);
    assert_eq!(drv.used_available(), Ok(1));
    assert_used_sticky(
        &mut drv,
        Error::UsedIdInvalid {
            id: u32::from(second),
        },
    );
    // The real head with the chain's full writable capacity is accepted; one more is not.
    h.used(0, u32::from(head), 3 * 64 + 1);
    assert_used_sticky(
        &mut drv,
        Error::UsedLenTooBig {
            id: head,
            len: 3 * 64 + 1,
            cap: 3 * 64,
        },
    );
    h.used(0, u32::from(head), 3 * 64);
    assert_eq!(drv.pop_used(), Ok(Some((head, 3 * 64))));
    assert_eq!(drv.free_count(), usize::from(SIZE));
}

#[test]
fn used_len_larger_than_buffer() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let (mut drv, ids) = driver_with(&mq, 2, true);
    h.used(0, u32::from(ids[1]), BUF + 1);
    h.used_idx(1);
    assert_eq!(drv.used_available(), Ok(1));
    let want = Error::UsedLenTooBig {
        id: ids[1],
        len: BUF + 1,
        cap: BUF,
    };
    assert_used_sticky(&mut drv, want);
    h.used(0, u32::from(ids[1]), u32::MAX);
    assert_used_sticky(
        &mut drv,
        Error::UsedLenTooBig {
            id: ids[1],
            len: u32::MAX,
            cap: BUF,
        },
    );
    h.used(0, u32::from(ids[1]), BUF);
    assert_eq!(drv.pop_used(), Ok(Some((ids[1], BUF))));
}

/// On a device-reads queue the device writes nothing, so used.len has nothing to say: a
/// nonzero one (DPDK's vhost writes the bytes it read in its in-order transmit batches) is
/// taken as 0, and the queue goes on. Nothing of such a buffer is ever read back.
#[test]
fn used_len_on_a_readable_buffer_is_taken_as_zero() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let (mut drv, ids) = driver_with(&mq, 2, false);
    h.used(0, u32::from(ids[0]), 76);
    h.used(1, u32::from(ids[1]), u32::MAX);
    h.used_idx(2);
    assert_eq!(drv.used_available(), Ok(2));
    assert_eq!(drv.pop_used(), Ok(Some((ids[0], 0))));
    assert_eq!(drv.pop_used(), Ok(Some((ids[1], 0))));
    assert_eq!(drv.pop_used(), Ok(None));
}

#[test]
fn used_idx_jump_beyond_in_flight() {
    let mq = mock();
    let h = Hostile { mq: &mq };
    let (mut drv, ids) = driver_with(&mq, 2, true);
    h.used(0, u32::from(ids[0]), 0);
    h.used(1, u32::from(ids[1]), 0);
    h.used(2, u32::from(ids[1]), 0);
    h.used_idx(3);
    let want = Error::UsedIdxJump {
        last: 0,
        idx: 3,
        in_flight: 2,
    };
    for _ in 0..3 {
        assert_eq!(drv.used_available(), Err(want));
        assert_eq!(drv.pop_used(), Ok(None), "nothing taken from the bad index");
        assert_eq!(
            (drv.free_count(), drv.in_flight()),
            (usize::from(SIZE) - 2, 2)
        );
    }
    assert_eq!(
        drv.arm_used_notify(),
        Err(want),
        "arm re-check reports it too"
    );
    // Backwards.
    h.used_idx(0xffff);
    assert_eq!(
        drv.used_available(),
        Err(Error::UsedIdxJump {
            last: 0,
            idx: 0xffff,
            in_flight: 2
        })
    );
    // Back to a legal index: both entries are reclaimed normally.
    h.used_idx(2);
    assert_eq!(drv.used_available(), Ok(2));
    assert_eq!(drv.pop_used(), Ok(Some((ids[0], 0))));
    assert_eq!(drv.pop_used(), Ok(Some((ids[1], 0))));
    assert_eq!(drv.pop_used(), Ok(None));
    // Nothing in flight: any movement is a jump.
    h.used_idx(3);
    assert_eq!(
        drv.used_available(),
        Err(Error::UsedIdxJump {
            last: 2,
            idx: 3,
            in_flight: 0
        })
    );
}

/// Errors are values, not panics, even when everything is garbage: a fixed pseudo-random
/// sweep over descriptor tables, with the device draining whatever it can.
#[test]
fn garbage_never_panics() {
    let mq = mock();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let ring_len = usize::try_from(mq.bufs - GPA_BASE).expect("small");
    let mut errors = 0;
    for round in 0..2000 {
        let dir = [
            Direction::DeviceReads,
            Direction::DeviceWrites,
            Direction::Mixed,
        ][round % 3];
        let mut dev = device(&mq, dir, round % 2 == 0);
        let mut bytes = vec![0u8; ring_len];
        for b in bytes.iter_mut() {
            *b = rnd().to_le_bytes()[0];
        }
        // Keep addresses mostly plausible: point them into the buffer area.
        for i in 0..usize::from(SIZE) {
            let addr = mq.bufs + rnd() % (u64::from(SIZE) * u64::from(BUF) + 64);
            bytes[16 * i..16 * i + 8].copy_from_slice(&addr.to_le_bytes());
            let len = u32::try_from(rnd() % 512).expect("small");
            bytes[16 * i + 8..16 * i + 12].copy_from_slice(&len.to_le_bytes());
            bytes[16 * i + 14] %= 10;
            bytes[16 * i + 15] = 0;
        }
        mq.poke(GPA_BASE, &bytes);
        Hostile { mq: &mq }.avail_idx(u16::try_from(rnd() % 12).expect("small"));
        let n = match dev.available() {
            Ok(n) => n,
            Err(_) => {
                errors += 1;
                continue;
            }
        };
        for _ in 0..n {
            match dev.pop() {
                Ok(Some(c)) => dev.push_used(c.head, c.writable),
                Ok(None) => break,
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
        }
        let _ = dev.publish();
    }
    assert!(errors > 100, "the sweep should hit errors ({errors})");
}
