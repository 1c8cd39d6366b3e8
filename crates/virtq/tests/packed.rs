//! The packed ring (virtio 1.1+, 2.8) in both roles, beyond the contract every format keeps
//! (`seams.rs`): wrap counters over many laps with chains of every shape, indirect tables,
//! `unpop` across the wrap, restart from a vhost-user base, and what a peer that breaks the
//! rules gets.

// Indexes and byte values here are small by construction.
#![allow(clippy::cast_possible_truncation)]

use virtq::event::Armed;
use virtq::mem::{read_segs, write_segs};
use virtq::mock::MockQueue;
use virtq::packed::{PackedDesc, DESC_F_AVAIL, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_USED};
use virtq::queue::{Buf, DeviceQueue, Direction, DriverQueue, QueueConfig};
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

#[test]
fn a_chain_whose_tail_is_not_available_is_refused() {
    let mq = MockQueue::new(SIZE, 64);
    let (_drv, mut dev) = pair(&mq, Direction::DeviceReads, false);
    let desc = |slot: u16, flags| PackedDesc {
        addr: mq.buf(slot),
        len: 8,
        id: 0,
        flags,
    };
    // Slot 0 available with NEXT, slot 1 not: no whole chain yet.
    poke_desc(&mq, 0, desc(0, DESC_F_AVAIL | DESC_F_NEXT));
    assert_eq!(dev.available(), Ok(0));
    // Slot 1 available: one chain...
    poke_desc(&mq, 1, desc(1, DESC_F_AVAIL));
    assert_eq!(dev.available(), Ok(1));
    // ...taken back by the driver before the device parsed it (a driver that breaks the
    // rule): the parse reads each descriptor once and refuses, consuming nothing.
    poke_desc(&mq, 1, desc(1, DESC_F_USED));
    assert_eq!(dev.pop(), Err(Error::DescNotAvailable { index: 1 }));
    assert_eq!(dev.last_avail(), 0x8000, "nothing consumed");
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
