//! Device side against a hostile driver: the input fills the descriptor table, the avail
//! ring and a small area that descriptors can use as indirect tables; the device parses,
//! touches every segment, pushes used entries and publishes, for several batches.
//!
//! Input layout:
//! * byte 0: bit 0 event_idx, bit 1 indirect negotiated, bits 2-3 direction (0 device-reads,
//!   1 device-writes, 2/3 mixed), bits 4-5 queue size (2, 4, 8, 16);
//! * `size` x 16 bytes: descriptor table (addr u64, len u32, flags u16, next u16, LE);
//! * 2 bytes avail idx, `size` x 2 bytes avail ring;
//! * 256 bytes: the indirect area (16 entries, same layout), at buffer 0 of the mock;
//! * then rounds of 2 bytes: a new avail idx for the next batch.
//!
//! Descriptor addresses with bit 63 clear are folded into the mock region (a little before
//! its start to a little past its end), so that most chains reach the deep checks; with bit
//! 63 set they are used as they are. Lengths with bit 31 clear are folded below 1024.
//!
//! Must never panic; every error the queue returns is fine. Checked on every chain: segment
//! lengths add up to the chain's totals, no segment is empty, and the totals respect the
//! queue direction; every byte of every segment is read or written.

#![no_main]

mod common;

use common::{fold_descs, take};
use libfuzzer_sys::fuzz_target;
use virtq::mock::MockQueue;
use virtq::split::{DeviceQueue, Direction};
use virtq::{read_segs, write_segs};

const BUF: u32 = 256;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg_byte, mut data)) = data.split_first() else {
        return;
    };
    let event_idx = cfg_byte & 1 != 0;
    let indirect = cfg_byte & 2 != 0;
    let dir = match (cfg_byte >> 2) & 3 {
        0 => Direction::DeviceReads,
        1 => Direction::DeviceWrites,
        _ => Direction::Mixed,
    };
    let size = [2u16, 4, 8, 16][usize::from((cfg_byte >> 4) & 3)];
    let n = usize::from(size);

    let mq = MockQueue::new(size, BUF);
    let cfg = mq.config(dir, event_idx, indirect);
    let mut dev = DeviceQueue::new(mq.mem.clone(), &cfg).expect("mock layout is valid");

    let mut table = take(&mut data, 16 * n);
    fold_descs(&mut table, mq.len);
    mq.poke(mq.addrs.desc, &table);
    let avail = take(&mut data, 2 + 2 * n);
    mq.poke(mq.addrs.avail + 2, &avail);
    let mut area = take(&mut data, 256);
    fold_descs(&mut area, mq.len);
    mq.poke(mq.buf(0), &area);

    let mut scratch = vec![0u8; 4096];
    for round in 0..8 {
        if round > 0 {
            if data.len() < 2 {
                break;
            }
            let idx = take(&mut data, 2);
            mq.poke(mq.addrs.avail + 2, &idx);
        }
        let avail = match dev.available() {
            Ok(k) => k,
            Err(_) => continue,
        };
        assert!(avail <= size);
        let mut popped = 0u16;
        // Any error ends the batch: the harness only checks that nothing panics.
        while let Ok(Some(c)) = dev.pop() {
            popped += 1;
            assert!(popped <= avail, "more chains than the batch holds");
            assert!(c.head < size);
            let rs: u64 = dev.readable(&c).iter().map(|s| u64::from(s.len())).sum();
            let ws: u64 = dev.writable(&c).iter().map(|s| u64::from(s.len())).sum();
            assert_eq!(rs, u64::from(c.readable));
            assert_eq!(ws, u64::from(c.writable));
            assert_eq!(
                dev.readable(&c).len() + dev.writable(&c).len(),
                dev.segs(&c).len()
            );
            assert!(dev.segs(&c).iter().all(|s| !s.is_empty()), "empty segment");
            match dir {
                Direction::DeviceReads => assert_eq!(c.writable, 0),
                Direction::DeviceWrites => assert_eq!(c.readable, 0),
                Direction::Mixed => {}
            }
            // Touch the memory the chain names: read all of it, write all of it.
            let mut off = 0u32;
            while off < c.readable {
                let k = read_segs(dev.readable(&c), off, &mut scratch);
                assert!(k > 0);
                off += u32::try_from(k).expect("scratch is small");
            }
            let mut off = 0u32;
            while off < c.writable {
                let k = write_segs(dev.writable(&c), off, &scratch);
                assert!(k > 0);
                off += u32::try_from(k).expect("scratch is small");
            }
            dev.push_used(c.head, c.writable);
        }
        let _ = dev.publish();
        if round % 2 == 1 {
            let _ = dev.arm_notify();
            dev.disable_notify();
        }
    }
});
