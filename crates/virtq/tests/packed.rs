//! The packed ring (virtio 1.1+, 2.8) in both roles, beyond the contract every format keeps
//! (`seams.rs`): wrap counters over many laps with chains of every shape, indirect tables,
//! `unpop` across the wrap, restart from a vhost-user base, and what a peer that breaks the
//! rules gets.

// Indexes and byte values here are small by construction.
#![allow(clippy::cast_possible_truncation)]

use virtq::mock::MockQueue;
use virtq::packed::{PackedDesc, DESC_F_AVAIL, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_USED};
use virtq::Armed;
use virtq::{read_segs, write_segs};
use virtq::{Buf, DeviceQueue, Direction, DriverQueue, QueueConfig};
use virtq::{Error, Format};

const SIZE: u16 = 8;

fn pair(mq: &MockQueue, dir: Direction, event_idx: bool) -> (DriverQueue, DeviceQueue) {
    mq.pair_in(Format::Packed, dir, event_idx)
        .expect("packed pair")
}

/// Chains of 1, 2 and 3 descriptors, many laps: every byte, id and length comes back, the
/// wrap counters flip where they must, and the device's base says where it is.
#[test]
fn many_laps_with_chains_of_every_length() {
    for event_idx in [false, true] {
        let mq = MockQueue::new(SIZE, 64);
        let (mut drv, mut dev) = pair(&mq, Direction::DeviceReads, event_idx);
        dev.disable_notify();
        let mut seq = 0u8;
        let mut slots_used = 0u64;
        for round in 0..200u32 {
            let n = 1 + (round % 3) as usize;
            // Buffers are the mock's: chain k of a round uses buffers from a rotating base.
            let bufs: Vec<Buf> = (0..n)
                .map(|k| {
                    let b = mq.buf(((round as usize * 3 + k) % usize::from(SIZE)) as u16);
                    mq.poke(b, &[seq.wrapping_add(k as u8); 16]);
                    Buf {
                        addr: b,
                        len: 16,
                        write: false,
                    }
                })
                .collect();
            let id = if n == 1 {
                drv.add_one(bufs[0]).expect("room")
            } else {
                drv.add_chain(&bufs).expect("room")
            };
            drv.publish();
            assert_eq!(dev.available(), Ok(1), "round {round}");
            let c = dev.pop().expect("valid").expect("a chain");
            assert_eq!(c.head, id, "the buffer id comes from the chain");
            assert_eq!(c.readable, 16 * n as u32);
            let mut got = vec![0u8; 16 * n];
            read_segs(dev.readable(&c), 0, &mut got);
            for k in 0..n {
                assert!(got[16 * k..16 * (k + 1)]
                    .iter()
                    .all(|&b| b == seq.wrapping_add(k as u8)));
            }
            dev.push_used(c.head, 0);
            dev.publish();
            assert_eq!(drv.used_available(), Ok(1));
            assert_eq!(drv.pop_used().expect("valid"), Some((id, 0)));
            slots_used += n as u64;
            seq = seq.wrapping_add(7);
            let base = dev.last_avail();
            assert_eq!(u64::from(base & 0x7fff), slots_used % u64::from(SIZE));
            let wrap = (slots_used / u64::from(SIZE)).is_multiple_of(2);
            assert_eq!(
                base & 0x8000 != 0,
                wrap,
                "wrap counter after {slots_used} slots"
            );
        }
        assert_eq!(drv.free_count(), usize::from(SIZE));
    }
}

#[test]
fn device_writes_land_and_lengths_are_checked_by_the_driver() {
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceWrites, true);
    for i in 0..3 {
        drv.add_one(Buf {
            addr: mq.buf(i),
            len: 64,
            write: true,
        })
        .expect("room");
    }
    drv.publish();
    assert_eq!(dev.available(), Ok(3));
    let mut chains = Vec::new();
    dev.pop_batch(&mut chains, 8, |_| {}).expect("valid");
    for (k, c) in chains.iter().enumerate() {
        write_segs(dev.writable(c), 0, &[k as u8 + 1; 10]);
        dev.push_used(c.head, 10);
    }
    assert!(dev.publish(), "the first decision always notifies");
    assert_eq!(drv.used_available(), Ok(3));
    for k in 0..3u16 {
        let (id, len) = drv.pop_used().expect("valid").expect("used");
        assert_eq!((id, len), (k, 10));
        let mut b = [0u8; 10];
        mq.peek(mq.buf(id), &mut b);
        assert_eq!(b, [k as u8 + 1; 10]);
    }
}

#[test]
fn indirect_tables_are_walked_in_order() {
    let mq = MockQueue::new(SIZE, 256);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    // A table of three descriptors in buffer 7, pointing into buffers 1..=3.
    let mut table = Vec::new();
    for k in 1..=3u16 {
        mq.poke(mq.buf(k), &[k as u8; 20]);
        let d = PackedDesc {
            addr: mq.buf(k),
            len: 20,
            id: 0,
            flags: 0,
        };
        table.extend_from_slice(&d.addr.to_le_bytes());
        table.extend_from_slice(&d.len.to_le_bytes());
        table.extend_from_slice(&d.id.to_le_bytes());
        table.extend_from_slice(&d.flags.to_le_bytes());
    }
    mq.poke(mq.buf(7), &table);
    // The ring descriptor: INDIRECT, written by hand (the driver API adds plain buffers).
    let id = drv
        .add_one(Buf {
            addr: mq.buf(7),
            len: 48,
            write: false,
        })
        .expect("room");
    // Flip the INDIRECT bit into the held (not yet published) first descriptor: publish
    // stores the flags kept by the driver, so poke the flags after publishing instead.
    drv.publish();
    let slot0 = mq.addrs.desc + 14;
    let mut f = [0u8; 2];
    mq.peek(slot0, &mut f);
    let flags = u16::from_le_bytes(f) | DESC_F_INDIRECT;
    mq.poke(slot0, &flags.to_le_bytes());
    assert_eq!(dev.available(), Ok(1));
    let c = dev.pop().expect("valid").expect("chain");
    assert_eq!((c.head, c.readable), (id, 60));
    let mut got = [0u8; 60];
    read_segs(dev.readable(&c), 0, &mut got);
    assert_eq!(got[..20], [1; 20]);
    assert_eq!(got[20..40], [2; 20]);
    assert_eq!(got[40..], [3; 20]);
}

#[test]
fn unpop_across_the_wrap_gives_back_exactly_those_chains() {
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    let buf = |i: u16| Buf {
        addr: mq.buf(i),
        len: 8,
        write: false,
    };
    // Six slots round trip: the ring is 6 into its first lap.
    for i in 0..6 {
        drv.add_one(buf(i)).expect("room");
    }
    drv.publish();
    dev.available().expect("valid");
    while let Some(c) = dev.pop().expect("valid") {
        dev.push_used(c.head, 0);
    }
    dev.publish();
    drv.used_available().expect("valid");
    while drv.pop_used().expect("valid").is_some() {}
    // Two chains of two descriptors: slots 6-7 and 0-1, the second across the wrap.
    let a = drv.add_chain(&[buf(0), buf(1)]).expect("room");
    let b = drv.add_chain(&[buf(2), buf(3)]).expect("room");
    drv.publish();
    assert_eq!(dev.available(), Ok(2));
    let base = dev.last_avail();
    let mut chains = Vec::new();
    dev.pop_batch(&mut chains, 8, |_| {}).expect("valid");
    assert_eq!(chains.iter().map(|c| c.head).collect::<Vec<_>>(), [a, b]);
    assert_eq!(dev.last_avail(), 2, "past the wrap: slot 2, wrap counter 0");
    dev.unpop(2);
    assert_eq!(dev.last_avail(), base, "back where the batch began");
    assert_eq!(dev.available(), Ok(2));
    chains.clear();
    dev.pop_batch(&mut chains, 8, |_| {}).expect("valid");
    assert_eq!(chains.len(), 2);
}

#[test]
fn a_device_restarts_from_a_vhost_user_base() {
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceReads, true);
    for round in 0..11u16 {
        drv.add_one(Buf {
            addr: mq.buf(round % SIZE),
            len: 8,
            write: false,
        })
        .expect("room");
        drv.publish();
        dev.available().expect("valid");
        let c = dev.pop().expect("valid").expect("chain");
        dev.push_used(c.head, 0);
        dev.publish();
        drv.used_available().expect("valid");
        drv.pop_used().expect("valid");
    }
    // GET_VRING_BASE, then SET_VRING_BASE on a new device queue.
    let base = dev.last_avail();
    assert_eq!(base, 3, "slot 3 of the second lap: wrap counter 0");
    let cfg = QueueConfig {
        format: Format::Packed,
        base,
        ..mq.config(Direction::DeviceReads, true, true)
    };
    let mut dev2: DeviceQueue = DeviceQueue::new(mq.mem.clone(), &cfg).expect("restart");
    drv.add_one(Buf {
        addr: mq.buf(0),
        len: 8,
        write: false,
    })
    .expect("room");
    drv.publish();
    assert_eq!(dev2.available(), Ok(1));
    let c = dev2.pop().expect("valid").expect("chain");
    dev2.push_used(c.head, 0);
    dev2.publish();
    assert_eq!(
        drv.used_available(),
        Ok(1),
        "the used descriptor lands where the driver looks"
    );
    assert_eq!(dev2.arm_notify(), Ok(Armed::Empty));
}

fn poke_desc(mq: &MockQueue, slot: u16, d: PackedDesc) {
    let mut b = Vec::new();
    b.extend_from_slice(&d.addr.to_le_bytes());
    b.extend_from_slice(&d.len.to_le_bytes());
    b.extend_from_slice(&d.id.to_le_bytes());
    b.extend_from_slice(&d.flags.to_le_bytes());
    mq.poke(mq.addrs.desc + 16 * u64::from(slot), &b);
}

/// Writes slot `slot`'s descriptor: 8 bytes of buffer `slot`, buffer id `id`, `flags`.
fn poke_slot(mq: &MockQueue, slot: u16, id: u16, flags: u16) {
    let d = PackedDesc {
        addr: mq.buf(slot),
        len: 8,
        id,
        flags,
    };
    poke_desc(mq, slot, d);
}

#[test]
fn a_chain_whose_tail_is_not_available_is_refused() {
    let mq = MockQueue::new(SIZE, 64);
    let (_drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    // Slot 0 available with NEXT, slot 1 not: no whole chain yet.
    poke_slot(&mq, 0, 0, DESC_F_AVAIL | DESC_F_NEXT);
    assert_eq!(dev.available(), Ok(0));
    // Slot 1 available: one chain...
    poke_slot(&mq, 1, 0, DESC_F_AVAIL);
    assert_eq!(dev.available(), Ok(1));
    // ...taken back by the driver before the device parsed it (a driver that breaks the
    // rule): the parse reads each descriptor once and refuses, consuming nothing.
    poke_slot(&mq, 1, 0, DESC_F_USED);
    assert_eq!(dev.pop(), Err(Error::DescNotAvailable { index: 1 }));
    assert_eq!(dev.last_avail(), 0x8000, "nothing consumed");
}

#[test]
fn a_counted_chain_rewritten_longer_never_makes_the_count_exceed_the_ring() {
    // Found by the packed_chain fuzz target: the count a batch carries over from the last
    // walk must not outgrow the slots it stands for.
    let mq = MockQueue::new(SIZE, 64);
    let (_drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    // Two one-descriptor chains, counted.
    poke_slot(&mq, 0, 0, DESC_F_AVAIL);
    poke_slot(&mq, 1, 1, DESC_F_AVAIL);
    assert_eq!(dev.available(), Ok(2));
    // The driver makes the first one a two-descriptor chain before the device parses it:
    // one chain is taken, both slots with it.
    poke_slot(&mq, 0, 0, DESC_F_AVAIL | DESC_F_NEXT);
    let c = dev.pop().expect("valid").expect("chain");
    assert_eq!(c.head, 1);
    // Then every slot is available again: the rest of this lap and the next lap's first two.
    for slot in 2..SIZE {
        poke_slot(&mq, slot, slot, DESC_F_AVAIL);
    }
    for slot in 0..2 {
        poke_slot(&mq, slot, slot, DESC_F_USED);
    }
    let n = dev.available().expect("valid");
    assert!(n <= SIZE, "{n} chains counted in a ring of {SIZE}");
    // Each of them parses (the count is what the walk found in the slots ahead).
    for _ in 0..n {
        assert!(dev.pop().expect("valid").is_some());
    }
}

#[test]
fn buffer_ids_and_directions_are_validated() {
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    drv.add_one(Buf {
        addr: mq.buf(0),
        len: 8,
        write: false,
    })
    .expect("room");
    drv.publish();
    // Rewrite the id to one past the ring.
    mq.poke(mq.addrs.desc + 12, &SIZE.to_le_bytes());
    assert_eq!(dev.available(), Ok(1));
    assert_eq!(
        dev.pop(),
        Err(Error::DescIndexOutOfRange {
            index: SIZE,
            size: SIZE
        })
    );
    // A writable buffer on a queue the device only reads.
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    drv.add_one(Buf {
        addr: mq.buf(0),
        len: 8,
        write: true,
    })
    .expect("room");
    drv.publish();
    dev.available().expect("valid");
    assert!(matches!(dev.pop(), Err(Error::DirectionMismatch { .. })));
}

#[test]
fn the_driver_refuses_used_descriptors_it_did_not_hand_out() {
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceWrites, false);
    drv.add_one(Buf {
        addr: mq.buf(0),
        len: 16,
        write: true,
    })
    .expect("room");
    drv.publish();
    dev.available().expect("valid");
    let c = dev.pop().expect("valid").expect("chain");
    // Claims more bytes than the buffer holds.
    dev.push_used(c.head, 17);
    dev.publish();
    assert_eq!(drv.used_available(), Ok(1));
    assert_eq!(
        drv.pop_used(),
        Err(Error::UsedLenTooBig {
            id: 0,
            len: 17,
            cap: 16
        })
    );
    // A used descriptor naming a buffer not in flight.
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, _dev) = pair(&mq, Direction::DeviceWrites, false);
    drv.add_one(Buf {
        addr: mq.buf(0),
        len: 16,
        write: true,
    })
    .expect("room");
    drv.publish();
    poke_desc(
        &mq,
        0,
        PackedDesc {
            addr: 0,
            len: 0,
            id: 5,
            flags: DESC_F_AVAIL | DESC_F_USED,
        },
    );
    assert_eq!(drv.used_available(), Err(Error::UsedIdInvalid { id: 5 }));
}

// ---- property test: random operations through both roles against a model -----------------

mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    const BUF: u32 = 64;

    #[derive(Debug, Clone)]
    enum Op {
        /// Driver adds a chain of `lens.len()` descriptors (1-3).
        Add(Vec<u32>),
        /// Driver adds one-descriptor buffers of these lengths in one run (`add_many`).
        AddRun(Vec<u32>),
        Publish,
        /// Device pops up to `max`, starting a new batch first if `reload`.
        Pop {
            max: usize,
            reload: bool,
        },
        /// Device gives back up to `n` of the chains it popped and did not complete.
        Unpop(usize),
        /// Device completes up to `n` popped chains, in pop order.
        Push(usize),
        DevPublish,
        Reclaim(usize),
        /// Driver takes up to `n` used buffers with `pop_used_batch`.
        ReclaimBatch(usize),
        DevArm,
        DrvArm,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => prop::collection::vec(1..=BUF, 1..=3).prop_map(Op::Add),
            3 => prop::collection::vec(1..=BUF, 1..=12).prop_map(Op::AddRun),
            4 => Just(Op::Publish),
            5 => (1usize..=8, prop::bool::weighted(0.7)).prop_map(|(max, reload)| Op::Pop { max, reload }),
            2 => (1usize..=4).prop_map(Op::Unpop),
            4 => (1usize..=8).prop_map(Op::Push),
            4 => Just(Op::DevPublish),
            5 => (1usize..=8).prop_map(Op::Reclaim),
            3 => (1usize..=12).prop_map(Op::ReclaimBatch),
            2 => Just(Op::DevArm),
            2 => Just(Op::DrvArm),
        ]
    }

    /// A buffer in flight: its id, its descriptors' lengths, the tag its bytes carry.
    #[derive(Debug, Clone, PartialEq)]
    struct Flight {
        id: u16,
        lens: Vec<u32>,
        tag: u8,
    }

    struct World {
        mq: MockQueue,
        drv: DriverQueue,
        dev: DeviceQueue,
        write: bool,
        size: u16,
        /// Added, not yet published / published, not yet popped / popped, not completed /
        /// completed (pushed), not yet published by the device / returned to the driver.
        added: Vec<Flight>,
        published: VecDeque<Flight>,
        popped: Vec<(Flight, virtq::Chain)>,
        pushed: Vec<Flight>,
        used: VecDeque<Flight>,
        /// Buffer slots handed to the driver's descriptors, per id (one slot per descriptor).
        slots: Vec<Vec<u16>>,
        next_slot: u16,
        tag: u8,
        /// A side armed and found its ring empty: the peer's next publish must notify it.
        dev_armed: bool,
        drv_armed: bool,
        laps: u64,
    }

    impl World {
        fn new(size: u16, write: bool, event_idx: bool, in_order: bool) -> Self {
            let mq = MockQueue::new(size, BUF);
            let dir = if write {
                Direction::DeviceWrites
            } else {
                Direction::DeviceReads
            };
            // IN_ORDER: the device returns a transmit batch with one used descriptor, and
            // the driver must take it as every buffer up to the one it names.
            let (drv, mut dev) = mq
                .pair_with(Format::Packed, dir, event_idx, in_order)
                .expect("pair");
            dev.disable_notify();
            let mut drv = drv;
            drv.disable_used_notify();
            Self {
                mq,
                drv,
                dev,
                write,
                size,
                added: Vec::new(),
                published: VecDeque::new(),
                popped: Vec::new(),
                pushed: Vec::new(),
                used: VecDeque::new(),
                slots: vec![Vec::new(); usize::from(size)],
                next_slot: 0,
                tag: 1,
                dev_armed: false,
                drv_armed: false,
                laps: 0,
            }
        }

        /// The driver got buffer `id` back with `len` bytes written: the model's next used
        /// one, its bytes as the device wrote them.
        fn returned(&mut self, id: u16, len: u32) {
            let f = self.used.pop_front().expect("a used buffer");
            assert_eq!(id, f.id, "used in completion order");
            if self.write {
                let total: u32 = f.lens.iter().sum();
                assert_eq!(len, total);
                let mut k = 0;
                for (&s, &l) in self.slots[usize::from(id)].iter().zip(&f.lens) {
                    let mut b = vec![0u8; l as usize];
                    self.mq.peek(self.mq.buf(s), &mut b);
                    assert!(b.iter().all(|&x| x == !f.tag), "device bytes intact");
                    k += l;
                }
                assert_eq!(k, total);
            } else {
                assert_eq!(len, 0);
            }
            self.laps += 1;
        }

        fn apply(&mut self, op: &Op) {
            match op {
                Op::Add(lens) => {
                    if lens.len() > self.drv.free_count() {
                        return;
                    }
                    let mut bufs = Vec::new();
                    let mut slots = Vec::new();
                    for &len in lens {
                        let s = self.next_slot;
                        self.next_slot = (self.next_slot + 1) % self.size;
                        let addr = self.mq.buf(s);
                        if !self.write {
                            self.mq.poke(addr, &vec![self.tag; len as usize]);
                        }
                        bufs.push(Buf {
                            addr,
                            len,
                            write: self.write,
                        });
                        slots.push(s);
                    }
                    let id = match self.drv.add_chain(&bufs) {
                        Ok(id) => id,
                        Err(Error::NoFreeDescriptors) => return,
                        Err(e) => panic!("add: {e}"),
                    };
                    self.slots[usize::from(id)] = slots;
                    self.added.push(Flight {
                        id,
                        lens: lens.clone(),
                        tag: self.tag,
                    });
                    self.tag = self.tag.wrapping_add(1).max(1);
                }
                Op::AddRun(lens) => {
                    let (mq, write, size) = (&self.mq, self.write, self.size);
                    let (mut next_slot, mut tag) = (self.next_slot, self.tag);
                    let mut got = Vec::new();
                    let n = self
                        .drv
                        .add_many(lens.len(), |k, id| {
                            let s = next_slot;
                            next_slot = (next_slot + 1) % size;
                            let addr = mq.buf(s);
                            if !write {
                                mq.poke(addr, &vec![tag; lens[k] as usize]);
                            }
                            got.push((id, s, lens[k], tag));
                            tag = tag.wrapping_add(1).max(1);
                            Some(Buf {
                                addr,
                                len: lens[k],
                                write,
                            })
                        })
                        .expect("add_many");
                    assert_eq!(n, got.len(), "every buffer handed over was added");
                    (self.next_slot, self.tag) = (next_slot, tag);
                    for (id, slot, len, tag) in got {
                        self.slots[usize::from(id)] = vec![slot];
                        self.added.push(Flight {
                            id,
                            lens: vec![len],
                            tag,
                        });
                    }
                }
                Op::Publish => {
                    let new = !self.added.is_empty();
                    let kick = self.drv.publish();
                    if new && self.dev_armed {
                        assert!(kick, "the device armed on an empty ring: it must be kicked");
                        // Woken: it polls again.
                        self.dev_armed = false;
                        self.dev.disable_notify();
                    } else {
                        // Nothing new, or a device that polls (notifications disabled, its
                        // event area says so): no kick, exactly.
                        assert!(!kick, "a kick the device did not ask for");
                    }
                    self.published.extend(self.added.drain(..));
                }
                Op::Pop { max, reload } => {
                    if *reload || self.dev.pending() == 0 {
                        if !self.popped.is_empty() {
                            return; // a new batch starts only once the last one is finished
                        }
                        let n = self.dev.available().expect("well-formed ring");
                        // Rings here are smaller than the scan window: every published chain.
                        assert_eq!(usize::from(n), self.published.len(), "available count");
                    }
                    for _ in 0..*max {
                        let Some(c) = self.dev.pop().expect("valid chain") else {
                            break;
                        };
                        let f = self
                            .published
                            .pop_front()
                            .expect("a chain the driver published");
                        assert_eq!(c.head, f.id, "FIFO order");
                        let total: u32 = f.lens.iter().sum();
                        if self.write {
                            assert_eq!((c.readable, c.writable), (0, total));
                        } else {
                            assert_eq!((c.readable, c.writable), (total, 0));
                            let mut b = vec![0u8; total as usize];
                            read_segs(self.dev.readable(&c), 0, &mut b);
                            assert!(b.iter().all(|&x| x == f.tag), "bytes intact");
                        }
                        self.popped.push((f, c));
                    }
                }
                Op::Unpop(n) => {
                    let n = (*n).min(self.popped.len());
                    for _ in 0..n {
                        let (f, _) = self.popped.pop().expect("popped");
                        self.published.push_front(f);
                    }
                    self.dev.unpop(u16::try_from(n).expect("small"));
                }
                Op::Push(n) => {
                    let n = (*n).min(self.popped.len());
                    for (f, c) in self.popped.drain(..n) {
                        let total: u32 = f.lens.iter().sum();
                        let len = if self.write {
                            write_segs(self.dev.writable(&c), 0, &vec![!f.tag; total as usize]);
                            total
                        } else {
                            0
                        };
                        self.dev.push_used(c.head, len);
                        self.pushed.push(f);
                    }
                }
                Op::DevPublish => {
                    let new = !self.pushed.is_empty();
                    let call = self.dev.publish();
                    if new && self.drv_armed {
                        assert!(call, "the driver armed on an empty ring: it must be called");
                        self.drv_armed = false;
                        self.drv.disable_used_notify();
                    } else {
                        assert!(!call, "a call the driver did not ask for");
                    }
                    self.used.extend(self.pushed.drain(..));
                }
                Op::Reclaim(max) => {
                    let n = self.drv.used_available().expect("well-formed used ring");
                    assert_eq!(
                        usize::from(n),
                        self.used.len(),
                        "every published used buffer"
                    );
                    for _ in 0..*max {
                        let Some((id, len)) = self.drv.pop_used().expect("valid used") else {
                            break;
                        };
                        self.returned(id, len);
                    }
                }
                Op::ReclaimBatch(max) => {
                    // What pvnet's frontend reclaims with: one pass over the run of used
                    // descriptors, then the counted way for the rest.
                    let mut out = Vec::new();
                    let n = self.drv.pop_used_batch(&mut out, *max).expect("valid used");
                    assert_eq!(n, out.len());
                    let waiting = self.used.len();
                    assert_eq!(n, (*max).min(waiting), "as many as wait, up to max");
                    for (id, len) in out {
                        self.returned(id, len);
                    }
                }
                Op::DevArm => {
                    if !self.popped.is_empty() {
                        return;
                    }
                    // Armed and empty: it sleeps until kicked (stays armed); not empty: it
                    // polls on. The re-check started a new batch either way.
                    match self.dev.arm_notify().expect("valid ring") {
                        Armed::Empty => {
                            assert!(self.published.is_empty(), "armed Empty with chains waiting");
                            self.dev_armed = true;
                        }
                        Armed::NotEmpty => {
                            assert!(!self.published.is_empty());
                            self.dev.disable_notify();
                        }
                    }
                }
                Op::DrvArm => {
                    // Armed and empty: it sleeps until called (stays armed); not empty: it
                    // polls on.
                    match self.drv.arm_used_notify().expect("valid used ring") {
                        Armed::Empty => {
                            assert!(self.used.is_empty(), "armed Empty with used waiting");
                            self.drv_armed = true;
                        }
                        Armed::NotEmpty => {
                            assert!(!self.used.is_empty());
                            self.drv.disable_used_notify();
                        }
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn random_operations_match_model(
            size in prop_oneof![Just(4u16), Just(8), Just(16)],
            write in any::<bool>(),
            event_idx in any::<bool>(),
            in_order in any::<bool>(),
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut w = World::new(size, write, event_idx, in_order);
            for op in &ops {
                w.apply(op);
            }
        }
    }
}

#[test]
fn in_order_returns_a_transmit_batch_with_one_used_descriptor() {
    let mq = MockQueue::new(SIZE, 64);
    let (mut drv, _) = pair(&mq, Direction::DeviceReads, false);
    let cfg = QueueConfig {
        format: Format::Packed,
        base: Format::Packed.fresh_base(),
        in_order: true,
        ..mq.config(Direction::DeviceReads, false, true)
    };
    let mut dev: DeviceQueue = DeviceQueue::new(mq.mem.clone(), &cfg).expect("device");
    let read = |slot: u64| {
        let mut b = [0u8; 16];
        mq.peek(mq.addrs.desc + 16 * slot, &mut b);
        (
            u16::from_le_bytes([b[12], b[13]]),
            u16::from_le_bytes([b[14], b[15]]),
        )
    };
    let buf = |i| Buf {
        addr: mq.buf(i),
        len: 8,
        write: false,
    };
    let used = DESC_F_AVAIL | DESC_F_USED;
    let batch = |drv: &mut DriverQueue, dev: &mut DeviceQueue, chains: &[&[u16]]| -> u16 {
        let mut last = 0;
        for c in chains {
            let bufs: Vec<Buf> = c.iter().map(|&i| buf(i)).collect();
            last = drv.add_chain(&bufs).expect("room");
        }
        drv.publish();
        assert_eq!(usize::from(dev.available().expect("valid")), chains.len());
        let mut popped = Vec::new();
        dev.pop_batch(&mut popped, 8, |_| {}).expect("valid");
        dev.push_used_all(&popped, 0);
        dev.publish();
        last
    };
    // Three one-descriptor buffers and a two-descriptor one: slots 0-4.
    let last = batch(&mut drv, &mut dev, &[&[0], &[1], &[2], &[3, 4]]);
    assert_eq!(
        read(0),
        (last, used),
        "one used descriptor, the batch's last id, slot 0"
    );
    for slot in 1..5 {
        assert_ne!(read(slot).1 & used, used, "slot {slot} not written as used");
    }
    // The next batch's used descriptor lands right after the first batch's five slots.
    let last = batch(&mut drv, &mut dev, &[&[5], &[6]]);
    assert_eq!(
        read(5),
        (last, used),
        "the device skipped the first batch's descriptors"
    );
    assert_eq!(dev.last_avail() & 0x7fff, 7);
}

/// `available()` counts whole chains within a window of `SCAN` slots, and a chain longer than
/// the window once it is whole, across the wrap: the walk flips the AVAIL/USED pattern where
/// the ring wraps and stops at the first slot not made available.
#[test]
fn available_counts_chains_past_the_window_and_across_the_wrap() {
    use virtq::packed::SCAN;
    const BIG: u16 = 256;
    let mq = MockQueue::new(BIG, 16);
    let (mut drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    dev.disable_notify();
    let buf = |k: u16| Buf {
        addr: mq.buf(k % BIG),
        len: 16,
        write: false,
    };
    // 200 single-descriptor chains: the window counts SCAN of them per look.
    for lap in 0..3u16 {
        for k in 0..200 {
            drv.add_one(buf(k)).expect("room");
        }
        drv.publish();
        let mut seen = 0usize;
        while seen < 200 {
            let n = dev.available().expect("walk");
            assert_eq!(
                n,
                SCAN.min(200 - seen as u16),
                "lap {lap}: a window at a time"
            );
            for _ in 0..n {
                let c = dev.pop().expect("valid").expect("chain");
                dev.push_used(c.head, 0);
            }
            seen += usize::from(n);
        }
        dev.publish();
        drv.used_available().expect("used");
        while drv.pop_used().expect("pop").is_some() {}
        assert_eq!(dev.available(), Ok(0));
    }
    // The ring has wrapped (600 slots over 256). A chain of SCAN + 6 descriptors, then a
    // single one: the window widens past the long chain and counts both.
    let long: Vec<Buf> = (0..SCAN + 6).map(buf).collect();
    drv.add_chain(&long).expect("room");
    drv.add_one(buf(0)).expect("room");
    drv.publish();
    assert_eq!(
        dev.available(),
        Ok(2),
        "the long chain, whole, and the single one"
    );
    let c = dev.pop().expect("valid").expect("chain");
    assert_eq!(c.readable, 16 * u32::from(SCAN + 6));
    dev.push_used(c.head, 0);
    let c = dev.pop().expect("valid").expect("chain");
    assert_eq!(c.readable, 16);
    dev.push_used(c.head, 0);
    dev.publish();
    drv.used_available().expect("used");
    while drv.pop_used().expect("pop").is_some() {}
    // Chains of 3 descriptors (a driver without indirect tables): one look counts as many
    // chains as a window of single ones, across the wrap, not SCAN / 3.
    for lap in 0..4u16 {
        for k in 0..SCAN {
            let chain: Vec<Buf> = (0..3).map(|j| buf(3 * k + j)).collect();
            drv.add_chain(&chain).expect("room");
        }
        drv.publish();
        assert_eq!(
            dev.available(),
            Ok(SCAN),
            "lap {lap}: a window's worth of chains"
        );
        for _ in 0..SCAN {
            let c = dev.pop().expect("valid").expect("chain");
            assert_eq!(c.readable, 48);
            dev.push_used(c.head, 0);
        }
        dev.publish();
        drv.used_available().expect("used");
        while drv.pop_used().expect("pop").is_some() {}
        assert_eq!(dev.available(), Ok(0));
    }
}

/// DPDK's virtio PMD on the packed ring (`virtqueue_enqueue_xmit_packed`, 22.11), as it sends
/// a multi-segment packet when `VIRTIO_RING_F_INDIRECT_DESC` is negotiated: each slot owns a
/// table initialised once with every entry's flags `WRITE` and id its index
/// (`vring_desc_init_indirect_packed`) and entry 0 pointing at the slot's virtio-net header;
/// per packet, entries 1.. get a segment each, flags `NEXT` (but the last) plus the ring's
/// current AVAIL/USED bits, and the header entry is never rewritten, so it keeps `WRITE`.
/// The ring slot points at the table, id = the slot under IN_ORDER.
struct DpdkTx<'a> {
    mq: &'a MockQueue,
    /// Next slot and the driver's wrap counter there.
    slot: u16,
    wrap: bool,
}

/// Header bytes DPDK's virtio-user sends (12: VERSION_1).
const DPDK_HDR: u32 = 12;

impl<'a> DpdkTx<'a> {
    /// Buffer `k` of the mock holds slot k's table (bytes 0..128), its header (128..140) and
    /// its segments (from 256).
    fn new(mq: &'a MockQueue) -> Self {
        for slot in 0..mq.size {
            let t = mq.buf(slot);
            for i in 0..8u16 {
                let (addr, len) = if i == 0 { (t + 128, DPDK_HDR) } else { (0, 0) };
                poke_table(mq, t, i, addr, len, i, virtq::packed::DESC_F_WRITE);
            }
        }
        Self {
            mq,
            slot: 0,
            wrap: true,
        }
    }

    /// Makes one packet of segments `lens` available in the next slot, its header and data
    /// bytes a pattern of `seq`; returns the buffer id the device must report.
    fn xmit(&mut self, seq: u8, lens: &[u32], in_order: bool) -> u16 {
        let (mq, slot) = (self.mq, self.slot);
        let t = mq.buf(slot);
        let cached = if self.wrap { DESC_F_AVAIL } else { DESC_F_USED };
        mq.poke(t + 128, &[seq; DPDK_HDR as usize]);
        let mut at = t + 256;
        for (k, &len) in lens.iter().enumerate() {
            let i = k as u16 + 1;
            let next = if k + 1 < lens.len() { DESC_F_NEXT } else { 0 };
            mq.poke(at, &vec![seq.wrapping_add(i as u8); len as usize]);
            poke_table(mq, t, i, at, len, i, next | cached);
            at += u64::from(len);
        }
        // Without IN_ORDER the id comes from DPDK's free list: any id not in flight.
        let id = if in_order { slot } else { (slot + 3) % mq.size };
        poke_desc(
            mq,
            slot,
            PackedDesc {
                addr: t,
                len: 16 * (lens.len() as u32 + 1),
                id,
                flags: DESC_F_INDIRECT | cached,
            },
        );
        self.slot += 1;
        if self.slot == mq.size {
            self.slot = 0;
            self.wrap = !self.wrap;
        }
        id
    }
}

/// Entry `i` of the indirect table at `table`.
fn poke_table(mq: &MockQueue, table: u64, i: u16, addr: u64, len: u32, id: u16, flags: u16) {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&addr.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&id.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    mq.poke(table + 16 * u64::from(i), &b);
}

/// DPDK's multi-segment transmit (indirect tables whose header entry says WRITE), with and
/// without IN_ORDER, over many laps: every packet is taken whole (header and segments, in
/// order), the ids come back, and the ignored flags are counted, one a packet. Before the
/// flag was tolerated the first packet stopped the queue (issue 38).
#[test]
fn dpdk_multi_segment_transmit_through_indirect_tables() {
    for in_order in [false, true] {
        let mq = MockQueue::new(SIZE, 1024);
        let cfg = QueueConfig {
            format: Format::Packed,
            base: Format::Packed.fresh_base(),
            in_order,
            ..mq.config(Direction::DeviceReads, false, true)
        };
        let mut dev: DeviceQueue = DeviceQueue::new(mq.mem.clone(), &cfg).expect("device");
        let mut drv = DpdkTx::new(&mq);
        let mut seq = 0u8;
        for round in 0..40u32 {
            // 1 to 3 packets a batch of 1, 2, 3 and 7 segments (mixed sizes, random splits).
            let n = 1 + (round % 3) as usize;
            let shapes: [&[u32]; 4] = [&[64], &[64, 64], &[14, 50, 530], &[60; 7]];
            let mut want = Vec::new();
            for k in 0..n {
                let lens = shapes[(round as usize + k) % shapes.len()];
                let id = drv.xmit(seq, lens, in_order);
                want.push((id, seq, lens));
                seq = seq.wrapping_add(11);
            }
            assert_eq!(
                usize::from(dev.available().expect("valid")),
                n,
                "round {round}"
            );
            let mut popped = Vec::new();
            dev.pop_batch(&mut popped, 8, |_| {})
                .unwrap_or_else(|e| panic!("round {round}, in_order {in_order}: {e}"));
            assert_eq!(popped.len(), n);
            for (c, &(id, seq, lens)) in popped.iter().zip(&want) {
                let total: u32 = lens.iter().sum();
                assert_eq!((c.head, c.readable, c.writable), (id, DPDK_HDR + total, 0));
                let mut got = vec![0u8; (DPDK_HDR + total) as usize];
                read_segs(dev.readable(c), 0, &mut got);
                assert!(got[..DPDK_HDR as usize].iter().all(|&b| b == seq), "header");
                let mut at = DPDK_HDR as usize;
                for (k, &len) in lens.iter().enumerate() {
                    let v = seq.wrapping_add(k as u8 + 1);
                    assert!(
                        got[at..at + len as usize].iter().all(|&b| b == v),
                        "segment {k}"
                    );
                    at += len as usize;
                }
            }
            assert_eq!(
                dev.take_write_ignored(),
                n as u64,
                "one header entry a packet"
            );
            assert_eq!(dev.take_write_ignored(), 0, "taken");
            dev.push_used_all(&popped, 0);
            dev.publish();
        }
    }
}
