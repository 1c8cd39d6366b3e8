//! Packed-ring device side against a hostile driver: the input fills the descriptor ring
//! (flags included: any mix of AVAIL/USED/NEXT/INDIRECT/WRITE bits), the driver event area
//! and an indirect area; the device parses, touches every segment, returns buffers and
//! publishes, for several batches, the driver rewriting descriptors between them.
//!
//! Input layout:
//! * byte 0: bit 0 event_idx, bit 1 indirect negotiated, bits 2-3 direction (0 device-reads,
//!   1 device-writes, 2/3 mixed), bits 4-5 queue size (2, 4, 8, 16), bit 6 start in the
//!   second lap (wrap counter 0);
//! * `size` x 16 bytes: the ring (addr u64, len u32, id u16, flags u16, LE);
//! * 4 bytes: the driver event area (off_wrap, flags);
//! * 256 bytes: the indirect area (16 entries, same layout), at buffer 0 of the mock;
//! * then rounds of 1 + 16 bytes: a slot and the descriptor the driver writes there.
//!
//! Addresses and lengths are folded toward the mapped region as in `desc_chain`. Must never
//! panic; every error the queue returns is fine. Checked on every chain: segment lengths add
//! up to the chain's totals, no segment is empty, the totals respect the queue direction, the
//! buffer id is inside the ring, and no batch yields more chains than `available` counted.

#![no_main]

mod common;

use common::{fold_descs, take};
use libfuzzer_sys::fuzz_target;
use virtq::mock::MockQueue;
use virtq::Format;
use virtq::{read_segs, write_segs};
use virtq::{DeviceQueue, Direction, QueueConfig};

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
    let second_lap = cfg_byte & 0x40 != 0;

    let mq = MockQueue::new(size, BUF);
    let cfg = QueueConfig {
        format: Format::Packed,
        base: if second_lap { 0 } else { 0x8000 },
        ..mq.config(dir, event_idx, indirect)
    };
    let mut dev: DeviceQueue =
        DeviceQueue::new(mq.mem.clone(), &cfg).expect("mock layout is valid");

    let mut ring = take(&mut data, 16 * n);
    fold_descs(&mut ring, mq.len);
    mq.poke(mq.addrs.desc, &ring);
    mq.poke(mq.addrs.avail, &take(&mut data, 4));
    let mut area = take(&mut data, 256);
    fold_descs(&mut area, mq.len);
    mq.poke(mq.buf(0), &area);

    let mut scratch = vec![0u8; 4096];
    for round in 0..8 {
        if round > 0 {
            if data.len() < 17 {
                break;
            }
            let slot = u64::from(take(&mut data, 1)[0] % u8::try_from(size).expect("small"));
            let mut d = take(&mut data, 16);
            fold_descs(&mut d, mq.len);
            mq.poke(mq.addrs.desc + 16 * slot, &d);
        }
        let avail = match dev.available() {
            Ok(k) => k,
            Err(_) => continue,
        };
        assert!(avail <= size);
        let mut popped = 0u16;
        while let Ok(Some(c)) = dev.pop() {
            popped += 1;
            assert!(popped <= avail, "more chains than the batch holds");
            assert!(c.head < size, "buffer id outside the ring");
            let rs: u64 = dev.readable(&c).iter().map(|s| u64::from(s.len())).sum();
            let ws: u64 = dev.writable(&c).iter().map(|s| u64::from(s.len())).sum();
            assert_eq!(rs, u64::from(c.readable));
            assert_eq!(ws, u64::from(c.writable));
            assert!(dev.segs(&c).iter().all(|s| !s.is_empty()), "empty segment");
            match dir {
                Direction::DeviceReads => assert_eq!(c.writable, 0),
                Direction::DeviceWrites => assert_eq!(c.readable, 0),
                Direction::Mixed => {}
            }
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
            if round % 3 == 2 && popped == 1 {
                // Give one back: it must come out again the same.
                dev.unpop(1);
                break;
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
