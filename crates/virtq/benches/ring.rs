//! Micro-benchmarks of the split-ring fast path, single thread, over a [`MockQueue`].
//!
//! * `ring/roundtrip_32x64B`: driver adds 32 one-descriptor 64-byte buffers and publishes;
//!   device starts a batch, pops 32, copies 64 bytes out of each, pushes used and publishes;
//!   driver reclaims 32. Throughput in packets.
//! * `ring/device_pop_push_publish_32`: the device side alone (the avail index is advanced
//!   by a 2-byte store over a ring whose entries stay valid).
//! * `mem/translate_*`: region-table lookups with the per-queue hint right, wrong, or for an
//!   unmapped address.
//!
//! Notifications are off on both sides (the polling fast path); the decisions are still
//! taken and fed to `black_box`.
//!
//! `cargo bench -p virtq --features mock --bench ring` (under a minute).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use virtq::mock::{MockQueue, OwnedMem};
use virtq::read_segs;
use virtq::split::{Buf, Direction};
use virtq::{MemTable, Perm, RegionSpec, Translate};

const QSIZE: u16 = 256;
const BATCH: u16 = 32;
const PKT: u32 = 64;

fn roundtrip(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(u64::from(BATCH)));
    for event_idx in [true, false] {
        let mq = MockQueue::new(QSIZE, 2048);
        let (mut drv, mut dev) = mq
            .pair(Direction::DeviceReads, event_idx)
            .expect("mock pair");
        drv.disable_used_notify();
        dev.disable_notify();
        let bufs: Vec<Buf> = (0..BATCH)
            .map(|i| Buf {
                addr: mq.buf(i),
                len: PKT,
                write: false,
            })
            .collect();
        let mut local = [0u8; PKT as usize];
        let name = if event_idx { "event_idx" } else { "flags" };
        g.bench_function(BenchmarkId::new("roundtrip_32x64B", name), |b| {
            b.iter(|| {
                for &buf in &bufs {
                    drv.add_one(buf).expect("free descriptors");
                }
                black_box(drv.publish());
                let n = dev.available().expect("valid ring");
                for _ in 0..n {
                    let c = dev.pop().expect("valid chain").expect("in batch");
                    black_box(read_segs(dev.readable(&c), 0, &mut local));
                    dev.push_used(c.head, 0);
                }
                black_box(dev.publish());
                drv.used_available().expect("valid used ring");
                while let Some(u) = drv.pop_used().expect("valid used entry") {
                    black_box(u);
                }
            });
        });
    }

    // Device side alone: every descriptor and avail slot is filled once; each iteration
    // moves avail->idx by 32 and the device pops, pushes and publishes the batch.
    let mq = MockQueue::new(QSIZE, 2048);
    let (mut drv, mut dev) = mq.pair(Direction::DeviceReads, true).expect("mock pair");
    dev.disable_notify();
    for i in 0..QSIZE {
        drv.add_one(Buf {
            addr: mq.buf(i),
            len: PKT,
            write: false,
        })
        .expect("free descriptors");
    }
    let mut idx = 0u16;
    g.bench_function("device_pop_push_publish_32", |b| {
        b.iter(|| {
            idx = idx.wrapping_add(BATCH);
            mq.poke(mq.addrs.avail + 2, &idx.to_le_bytes());
            let n = dev.available().expect("valid ring");
            for _ in 0..n {
                let c = dev.pop().expect("valid chain").expect("in batch");
                dev.push_used(c.head, 0);
            }
            black_box(dev.publish());
        });
    });
    g.finish();
}

fn translate(c: &mut Criterion) {
    const REGIONS: u64 = 8;
    const LEN: u64 = 0x1_0000;
    let mems: Vec<OwnedMem> = (0..REGIONS)
        .map(|_| OwnedMem::new(usize::try_from(LEN).expect("small")))
        .collect();
    // Regions at 1 MiB strides, so there are gaps between them.
    let specs: Vec<RegionSpec> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| RegionSpec {
            gpa: 0x10_0000 * (i as u64 + 1),
            len: LEN,
            uaddr: 0x7f00_0000_0000 + 0x10_0000 * i as u64,
            host: m.as_ptr(),
        })
        .collect();
    // SAFETY: each region is exactly one owned allocation, moved into the table's owner.
    let mem = unsafe { MemTable::new(&specs, Box::new(mems)) }.expect("valid table");
    let mut g = c.benchmark_group("mem");
    g.throughput(Throughput::Elements(1));
    let hit = 0x50_0000 + 0x123;
    let mut hint = 4;
    g.bench_function("translate_hit", |b| {
        b.iter(|| black_box(mem.translate(black_box(hit), Perm::Read, &mut hint)));
    });
    // The hint names another region every time: a binary search over the table.
    let addrs: Vec<u64> = (1..=REGIONS).map(|i| 0x10_0000 * i + 0x40).collect();
    let mut k = 0;
    g.bench_function("translate_miss_other_region", |b| {
        b.iter(|| {
            k = (k + 3) % addrs.len();
            let mut hint = (k + 1) % addrs.len();
            black_box(mem.translate(black_box(addrs[k]), Perm::Read, &mut hint))
        });
    });
    let mut hint = 0;
    g.bench_function("translate_unmapped", |b| {
        b.iter(|| black_box(mem.translate(black_box(0x48_0000), Perm::Read, &mut hint)));
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = roundtrip, translate
}
criterion_main!(benches);
