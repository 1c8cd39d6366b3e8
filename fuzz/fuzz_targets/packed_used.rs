//! The packed ring's driver side against a hostile device, with and without IN_ORDER: the
//! driver keeps buffers in flight, the input rewrites the descriptor ring (where a packed
//! device writes its used descriptors) round after round, and the driver reclaims.
//!
//! Input layout:
//! * byte 0: bit 0 event_idx, bit 1 device-writes (else device-reads), bit 2 IN_ORDER,
//!   bits 4-5 queue size (2, 4, 8, 16);
//! * then rounds, each: 1 byte of buffers to add (low 2 bits: how many chains, bit 2: one
//!   chain of 2 buffers instead, bits 3-7: length seed), then `size` x 16 bytes written over
//!   the ring's descriptors (addr u64, len u32, id u16, flags u16, LE), of which byte 0 is a
//!   mask: only the slots whose bit is set are written (the others keep what the driver or an
//!   earlier round put there).
//!
//! Must never panic. The oracle: every `(id, len)` the driver accepts is a buffer this harness
//! has in flight, with `len` within its writable bytes (0 for a buffer the device only reads);
//! under IN_ORDER, buffers come back in the order they were made available; the driver's
//! in-flight count matches the harness's, and its free count never exceeds what is not in
//! flight.

#![no_main]

mod common;

use common::take_exact as take;
use libfuzzer_sys::fuzz_target;
use std::collections::VecDeque;
use virtq::mock::MockQueue;
use virtq::{Buf, Direction};
use virtq::{Error, Format};

const BUF: u32 = 256;

/// Notes a buffer the driver handed out: its writable capacity and descriptors, in order.
fn record(
    in_flight: &mut [Option<(u32, usize)>],
    used: &mut usize,
    order: &mut VecDeque<u16>,
    id: u16,
    (cap, nd): (u32, usize),
) {
    let s = &mut in_flight[usize::from(id)];
    assert!(s.is_none(), "id {id} handed out twice");
    *s = Some((cap, nd));
    *used += nd;
    order.push_back(id);
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg_byte, mut data)) = data.split_first() else {
        return;
    };
    let event_idx = cfg_byte & 1 != 0;
    let write = cfg_byte & 2 != 0;
    let in_order = cfg_byte & 4 != 0;
    let dir = if write {
        Direction::DeviceWrites
    } else {
        Direction::DeviceReads
    };
    let size = [2u16, 4, 8, 16][usize::from((cfg_byte >> 4) & 3)];
    let n = usize::from(size);
    let mq = MockQueue::new(size, BUF);
    let (mut drv, _dev) = mq
        .pair_with(Format::Packed, dir, event_idx, in_order)
        .expect("mock layout is valid");

    // Buffers in flight by id: writable capacity and descriptors; and the order they left.
    let mut in_flight: Vec<Option<(u32, usize)>> = vec![None; n];
    let mut order: VecDeque<u16> = VecDeque::new();
    let mut descs_used = 0usize;
    let mut slot = 0u16;
    let mut next_buf = |len: u32| {
        slot = (slot + 1) % size;
        Buf {
            addr: mq.buf(slot),
            len,
            write,
        }
    };

    for round in 0..16 {
        let Some(&add) = take(&mut data, 1).and_then(|b| b.first()) else {
            break;
        };
        let len = 1 + u32::from(add >> 3) * 8;
        let cap = if write { len } else { 0 };
        if add & 4 != 0 {
            let bufs = [next_buf(len), next_buf(len)];
            match drv.add_chain(&bufs) {
                Ok(id) => record(
                    &mut in_flight,
                    &mut descs_used,
                    &mut order,
                    id,
                    (2 * cap, 2),
                ),
                Err(e) => assert_eq!(e, Error::NoFreeDescriptors),
            }
        } else {
            for _ in 0..(add & 3) {
                match drv.add_one(next_buf(len)) {
                    Ok(id) => record(&mut in_flight, &mut descs_used, &mut order, id, (cap, 1)),
                    Err(e) => {
                        assert_eq!(e, Error::NoFreeDescriptors);
                        break;
                    }
                }
            }
        }
        let _ = drv.publish();

        // The hostile device writes over the slots its mask picks.
        let Some(ring) = take(&mut data, 16 * n) else {
            break;
        };
        let mask = ring[0];
        for (i, d) in ring.chunks_exact(16).enumerate() {
            if mask >> (i % 8) & 1 != 0 {
                mq.poke(mq.addrs.desc + 16 * i as u64, d);
            }
        }

        if round % 3 == 2 {
            let _ = drv.arm_used_notify();
            drv.disable_used_notify();
        }
        // Reclaim one of two ways, as the input picks: counted then popped one by one, or
        // `pop_used_batch` (up to a number the input picks). Any error ends the round (the
        // driver refuses the bad descriptor for good).
        let mut taken = Vec::new();
        if ring[1] & 1 != 0 {
            let _ = drv.pop_used_batch(&mut taken, usize::from(ring[1] >> 1));
            assert!(taken.len() <= usize::from(ring[1] >> 1));
        } else {
            let Ok(k) = drv.used_available() else {
                continue;
            };
            let flying = in_flight.iter().flatten().count();
            assert!(usize::from(k) <= flying);
            while let Ok(Some(e)) = drv.pop_used() {
                taken.push(e);
            }
        }
        for (id, len) in taken {
            let (cap, nd) = in_flight
                .get_mut(usize::from(id))
                .and_then(Option::take)
                .expect("driver accepted an id that is not in flight");
            assert!(len <= cap, "driver accepted len {len} > {cap}");
            let pos = order.iter().position(|&o| o == id).expect("in order list");
            if in_order {
                assert_eq!(pos, 0, "IN_ORDER: buffer {id} came back before older ones");
            }
            order.remove(pos);
            descs_used -= nd;
        }
        assert_eq!(
            usize::from(drv.in_flight()),
            in_flight.iter().flatten().count()
        );
        assert!(drv.free_count() <= n - descs_used);
    }
});
