//! Driver side against a hostile device: the driver keeps buffers in flight, the input fills
//! the used ring (idx and entries) round after round, and the driver reclaims.
//!
//! Input layout:
//! * byte 0: bit 0 event_idx, bit 1 device-writes (else device-reads), bits 4-5 queue size
//!   (2, 4, 8, 16);
//! * then rounds, each: 1 byte of buffers to add (low 2 bits: how many chains, bit 2: one
//!   chain of 2 buffers instead, bits 3-7: length seed), 2 bytes used idx, `size` x 8 bytes
//!   used entries (id u32, len u32, LE).
//!
//! Must never panic. The oracle: every `(id, len)` the driver accepts must be the head of a
//! buffer this harness has in flight, with `len` within its writable bytes; free and
//! in-flight counts must match the harness's own bookkeeping.

#![no_main]

mod common;

use common::take_exact as take;
use libfuzzer_sys::fuzz_target;
use virtq::mock::MockQueue;
use virtq::split::{Buf, Direction};
use virtq::Error;

const BUF: u32 = 256;

/// Notes a head the driver handed out: its writable capacity and descriptor count.
fn record(
    in_flight: &mut [Option<(u32, usize)>],
    used: &mut usize,
    head: u16,
    cap: u32,
    nd: usize,
) {
    let slot = &mut in_flight[usize::from(head)];
    assert!(slot.is_none(), "head {head} handed out twice");
    *slot = Some((cap, nd));
    *used += nd;
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg_byte, mut data)) = data.split_first() else {
        return;
    };
    let event_idx = cfg_byte & 1 != 0;
    let write = cfg_byte & 2 != 0;
    let dir = if write {
        Direction::DeviceWrites
    } else {
        Direction::DeviceReads
    };
    let size = [2u16, 4, 8, 16][usize::from((cfg_byte >> 4) & 3)];
    let n = usize::from(size);
    let mq = MockQueue::new(size, BUF);
    let (mut drv, _dev) = mq.pair(dir, event_idx).expect("mock layout is valid");

    // Heads in flight: writable capacity and number of descriptors.
    let mut in_flight: Vec<Option<(u32, usize)>> = vec![None; n];
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
                Ok(head) => record(&mut in_flight, &mut descs_used, head, 2 * cap, 2),
                Err(e) => {
                    assert_eq!(e, Error::NoFreeDescriptors);
                    assert!(n - descs_used < 2);
                }
            }
        } else {
            for _ in 0..(add & 3) {
                match drv.add_one(next_buf(len)) {
                    Ok(head) => record(&mut in_flight, &mut descs_used, head, cap, 1),
                    Err(e) => {
                        assert_eq!(e, Error::NoFreeDescriptors);
                        assert_eq!(descs_used, n);
                        break;
                    }
                }
            }
        }
        let _ = drv.publish();
        assert_eq!(drv.free_count(), n - descs_used);

        // The hostile device's used ring for this round.
        let Some(idx) = take(&mut data, 2) else { break };
        let Some(entries) = take(&mut data, 8 * n) else {
            break;
        };
        mq.poke(mq.addrs.used + 4, entries);
        mq.poke(mq.addrs.used + 2, idx);

        if round % 3 == 2 {
            let _ = drv.arm_used_notify();
            drv.disable_used_notify();
        }
        let Ok(k) = drv.used_available() else {
            continue;
        };
        assert!(usize::from(k) <= in_flight.iter().flatten().count());
        // Any error ends the round (the driver refuses the bad entry).
        while let Ok(Some((id, len))) = drv.pop_used() {
            let (cap, nd) = in_flight
                .get_mut(usize::from(id))
                .and_then(Option::take)
                .expect("driver accepted an id that is not a head in flight");
            assert!(len <= cap, "driver accepted used.len {len} > {cap}");
            descs_used -= nd;
            assert_eq!(drv.free_count(), n - descs_used);
        }
        assert_eq!(
            usize::from(drv.in_flight()),
            in_flight.iter().flatten().count()
        );
    }
});
