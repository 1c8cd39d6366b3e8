//! The device-side fast path in one thread, for instruction counting under callgrind, for
//! each ring format (the `_packed` functions run the packed ring):
//! a mock driver offers batches of 32 one-descriptor 64-byte packets (+12-byte header), the
//! device pops each batch (through the format-neutral `virtq::queue` types the dataplane uses), copies every packet out, returns the buffers and publishes once
//! per batch, and the driver reclaims them.
//!
//! `scripts/callgrind.sh` runs it twice (N and 2N packets) and divides the difference of the
//! device-side inclusive counts by N, so set-up cost cancels out.

use std::hint::black_box;
use virtq::mock::MockQueue;
use virtq::read_segs;
use virtq::Chain;
use virtq::{Buf, DeviceQueue, Direction, DriverQueue, Format};

const BATCH: u16 = 32;
const PKT: u32 = 76;

/// The three counted functions for one ring format (a distinct constant each, so that the
/// split and packed copies, otherwise the same code, stay distinct symbols).
macro_rules! path {
    ($offer:ident, $batch:ident, $reclaim:ident, $k:literal) => {
        #[inline(never)]
        fn $offer(drv: &mut DriverQueue, mq: &MockQueue) {
            // As pvnet's frontend adds a burst: the format chosen once for the run.
            let n = drv
                .add_many(usize::from(BATCH), |_, id| {
                    Some(Buf {
                        addr: mq.buf(id),
                        len: PKT,
                        write: false,
                    })
                })
                .expect("add");
            assert_eq!(n, usize::from(BATCH));
            black_box(drv.publish());
            black_box($k);
        }

        /// The device side of one batch, as the backend's sink does it: parse the whole
        /// batch (starting every packet's load), copy each packet out, then return the
        /// buffers.
        #[inline(never)]
        fn $batch(dev: &mut DeviceQueue, chains: &mut Vec<Chain>, scratch: &mut [u8; 2048]) -> u64 {
            let mut bytes = 0u64;
            chains.clear();
            dev.available().expect("available");
            dev.pop_batch(chains, usize::from(BATCH), |segs| {
                if let Some(s) = segs.first() {
                    s.prefetch(2);
                }
            })
            .expect("pop");
            for c in chains.iter() {
                bytes += read_segs(dev.readable(c), 0, &mut scratch[..PKT as usize]) as u64;
            }
            // As the backend returns a batch: every chain taken, in order, in one run.
            dev.push_used_all(chains, 0);
            black_box(dev.publish());
            bytes + black_box($k)
        }

        #[inline(never)]
        fn $reclaim(drv: &mut DriverQueue) {
            drv.used_available().expect("used");
            while drv.pop_used().expect("pop_used").is_some() {}
            black_box($k);
        }
    };
}

path!(driver_offer, device_batch, driver_reclaim, 0u64);
path!(
    driver_offer_packed,
    device_batch_packed,
    driver_reclaim_packed,
    1u64
);

fn main() {
    let packets: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let mut scratch = [0u8; 2048];
    let mut chains = Vec::with_capacity(usize::from(BATCH));
    let mut total = 0u64;
    for format in Format::ALL {
        let mq = MockQueue::new(256, 2048);
        let (mut drv, mut dev) = mq
            .pair_in(*format, Direction::DeviceReads, true)
            .expect("queues");
        dev.disable_notify();
        drv.disable_used_notify();
        for _ in 0..packets / u64::from(BATCH) {
            if *format == Format::Split {
                driver_offer(&mut drv, &mq);
                total += device_batch(&mut dev, &mut chains, &mut scratch);
                driver_reclaim(&mut drv);
            } else {
                driver_offer_packed(&mut drv, &mq);
                total += device_batch_packed(&mut dev, &mut chains, &mut scratch);
                driver_reclaim_packed(&mut drv);
            }
        }
    }
    println!("{packets} packets per format, {total} bytes");
}
