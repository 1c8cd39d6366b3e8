//! The two seams of the ring layer, each checked so that a second implementation plugged in
//! wrongly fails here:
//!
//! * every ring format in [`Format::ALL`] keeps the queue contract the dataplane relies on
//!   (batches, unpop, used ids and lengths, arm / re-check, stop and restart at `last_avail`);
//! * a translator other than the region table (a grant cache, as an IOTLB is) is honoured:
//!   a miss it reports as retryable consumes nothing, permissions are asked for exactly, and
//!   a revocation makes the queue re-translate its rings.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use virtq::mock::MockQueue;
use virtq::Armed;
use virtq::{read_segs, write_segs, AddrSpace};
use virtq::{Buf, DeviceQueue, Direction, QueueConfig};
use virtq::{Error, Format, Grant, Iotlb, MemTable, Miss, Perm, Translate};

fn offer(drv: &mut virtq::DriverQueue, mq: &MockQueue, ids: std::ops::Range<u16>, write: bool) {
    for i in ids {
        if !write {
            mq.poke(mq.buf(i), &[u8::try_from(i).unwrap(); 8]);
        }
        drv.add_one(Buf {
            addr: mq.buf(i),
            len: 8,
            write,
        })
        .unwrap();
    }
    drv.publish();
}

#[test]
fn every_format_keeps_the_queue_contract() {
    for &format in Format::ALL {
        let mq = MockQueue::new(16, 64);
        let (mut drv, mut dev) = mq.pair_in(format, Direction::DeviceReads, true).unwrap();
        assert_eq!((drv.format(), dev.format()), (format, format));
        dev.disable_notify();
        offer(&mut drv, &mq, 0..6, false);
        assert_eq!(
            dev.available().unwrap(),
            6,
            "{format:?}: one load sees the batch"
        );
        let mut chains = Vec::new();
        assert_eq!(dev.pop_batch(&mut chains, 4, |_| {}).unwrap(), 4);
        // Backpressure: the last two popped go back and come out again, in order.
        dev.unpop(2);
        chains.truncate(2);
        assert_eq!(
            dev.available().unwrap(),
            4,
            "{format:?}: unpopped chains are available"
        );
        assert_eq!(dev.pop_batch(&mut chains, 16, |_| {}).unwrap(), 4);
        let mut seen = Vec::new();
        for c in &chains[2..] {
            let mut b = [0u8; 8];
            assert_eq!(read_segs(dev.readable(c), 0, &mut b), 8);
            seen.push(b[0]);
        }
        assert_eq!(seen, [2, 3, 4, 5], "{format:?}: order kept across unpop");
        for c in &chains {
            dev.push_used(c.head, 0);
        }
        assert_eq!(dev.unpublished(), 6);
        dev.publish();
        assert_eq!(drv.used_available().unwrap(), 6);
        let mut ids = Vec::new();
        while let Some((id, len)) = drv.pop_used().unwrap() {
            assert_eq!(len, 0);
            ids.push(id);
        }
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..6).collect::<Vec<_>>(),
            "{format:?}: every id back once"
        );
        // Arm, re-check: empty, then work that arrives after arming is seen by a kick.
        assert_eq!(dev.arm_notify().unwrap(), Armed::Empty);
        drv.add_one(Buf {
            addr: mq.buf(0),
            len: 8,
            write: false,
        })
        .unwrap();
        assert!(drv.publish(), "{format:?}: an armed device is kicked");
        assert_eq!(dev.arm_notify().unwrap(), Armed::NotEmpty);
        // Stop and restart where it stopped (GET_VRING_BASE / SET_VRING_BASE).
        let base = dev.last_avail();
        assert_eq!(
            base & 0x7fff,
            6,
            "{format:?}: six chains consumed (packed: bit 15 is the wrap counter)"
        );
        let cfg = QueueConfig {
            format,
            base,
            ..mq.config(Direction::DeviceReads, true, true)
        };
        let mut dev2: DeviceQueue = DeviceQueue::new(mq.mem.clone(), &cfg).unwrap();
        assert_eq!(
            dev2.available().unwrap(),
            1,
            "{format:?}: restarts at the base"
        );
    }
}

/// The device tells a driver that ran dry from one still working: a publish finds it idle
/// only when it re-armed at exactly the end of the previous publish (Linux's NAPI completing
/// after consuming everything), in every format, and never without EVENT_IDX or while it
/// polls.
#[test]
fn a_publish_finds_the_driver_idle_only_when_it_ran_dry_and_armed() {
    /// One receive buffer used and published; the call decision and the idle witness.
    fn one(dev: &mut DeviceQueue) -> (bool, bool) {
        assert!(dev.available().unwrap() > 0);
        let c = dev.pop().unwrap().unwrap();
        dev.push_used(c.head, 8);
        let call = dev.publish();
        (call, dev.driver_idle())
    }
    fn drain(drv: &mut virtq::DriverQueue) -> usize {
        drv.used_available().unwrap();
        let mut n = 0;
        while drv.pop_used().unwrap().is_some() {
            n += 1;
        }
        n
    }
    for &format in Format::ALL {
        let mq = MockQueue::new(16, 64);
        let (mut drv, mut dev) = mq.pair_in(format, Direction::DeviceWrites, true).unwrap();
        dev.disable_notify();
        offer(&mut drv, &mq, 0..12, true);
        // The first decision has nothing to compare with.
        assert!(!one(&mut dev).1, "{format:?}: first publish");
        // The driver consumed everything and re-armed: the next publish finds it idle.
        assert_eq!(drain(&mut drv), 1);
        assert_eq!(drv.arm_used_notify().unwrap(), Armed::Empty);
        assert_eq!(one(&mut dev), (true, true), "{format:?}: ran dry, armed");
        // It has not looked since: the next publish finds it armed further back, not idle,
        // and owes it no call.
        assert_eq!(one(&mut dev), (false, false), "{format:?}: still asleep");
        // It wakes, takes one of the two, and arms behind: working, not idle.
        assert_eq!(drv.used_available().unwrap(), 2);
        assert!(drv.pop_used().unwrap().is_some());
        assert_eq!(drv.arm_used_notify().unwrap(), Armed::NotEmpty);
        assert!(!one(&mut dev).1, "{format:?}: armed with work left");
        // It polls: never idle, whatever it consumed.
        drv.disable_used_notify();
        drain(&mut drv);
        assert_eq!(one(&mut dev), (false, false), "{format:?}: polling");
        assert!(!one(&mut dev).1, "{format:?}: polling");
    }
    for &format in Format::ALL {
        // Without EVENT_IDX a flag cannot say where the driver stopped.
        let mq = MockQueue::new(16, 64);
        let (mut drv, mut dev) = mq.pair_in(format, Direction::DeviceWrites, false).unwrap();
        offer(&mut drv, &mq, 0..4, true);
        one(&mut dev);
        drain(&mut drv);
        assert_eq!(drv.arm_used_notify().unwrap(), Armed::Empty);
        assert_eq!(one(&mut dev), (true, false), "{format:?}: no EVENT_IDX");
    }
}

/// A grant cache over the mock's region: only ranges granted (with a permission) translate;
/// a miss is retryable; revoking bumps the generation.
#[derive(Debug)]
struct Grants {
    table: Arc<MemTable>,
    granted: Mutex<BTreeMap<u64, (u64, Perm)>>,
    generation: AtomicU64,
    misses: AtomicU64,
}

impl Grants {
    fn new(table: Arc<MemTable>) -> Self {
        Self {
            table,
            granted: Mutex::new(BTreeMap::new()),
            generation: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
    fn grant(&self, addr: u64, len: u64, perm: Perm) {
        self.granted.lock().unwrap().insert(addr, (len, perm));
    }
    fn revoke(&self, addr: u64) {
        self.granted.lock().unwrap().remove(&addr);
        self.generation.fetch_add(1, Ordering::Release);
    }
    /// Bytes granted contiguously from `addr` with `perm`.
    fn check(&self, addr: u64, perm: Perm) -> Option<u64> {
        let g = self.granted.lock().unwrap();
        let (&start, &(len, p)) = g.range(..=addr).next_back()?;
        (addr < start + len && p.allows(perm)).then(|| start + len - addr)
    }
}

impl Translate for Grants {
    fn translate(
        &self,
        addr: u64,
        perm: Perm,
        hint: &mut usize,
    ) -> Result<(NonNull<u8>, u64), Miss> {
        let miss = Miss { addr, len: 1, perm };
        let Some(granted) = self.check(addr, perm) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return Err(miss);
        };
        let (p, contig) = self.table.translate(addr, perm, hint)?;
        Ok((p, contig.min(granted)))
    }
    fn translate_range(
        &self,
        space: AddrSpace,
        addr: u64,
        len: u64,
        perm: Perm,
    ) -> Result<NonNull<u8>, Miss> {
        let miss = Miss { addr, len, perm };
        if self.check(addr, perm).is_none_or(|g| g < len) {
            return Err(miss);
        }
        self.table.translate_range(space, addr, len, perm)
    }
    fn miss_error(&self, m: Miss) -> Error {
        Error::TranslationMiss {
            addr: m.addr,
            len: m.len,
            perm: m.perm,
        }
    }
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

#[test]
fn a_grant_cache_translator_is_honoured() {
    let mq = MockQueue::new(8, 64);
    let (mut drv, _) = mq
        .pair_in(Format::Split, Direction::DeviceWrites, true)
        .unwrap();
    let grants = Arc::new(Grants::new(mq.mem.clone()));
    // The rings are granted (the used ring writable), the buffers not yet.
    let (dl, al, ul) = virtq::split::ring_sizes(8);
    grants.grant(mq.addrs.desc, dl, Perm::Read);
    grants.grant(mq.addrs.avail, al, Perm::ReadWrite);
    grants.grant(mq.addrs.used, ul, Perm::ReadWrite);
    let cfg = mq.config(Direction::DeviceWrites, true, true);
    let mut dev = DeviceQueue::new(grants.clone(), &cfg).unwrap();
    offer(&mut drv, &mq, 0..2, true);

    // A miss is retryable and consumes nothing.
    assert_eq!(dev.available().unwrap(), 2);
    let mut chains = Vec::new();
    let e = dev.pop_batch(&mut chains, 8, |_| {}).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(chains.is_empty());
    assert_eq!(dev.last_avail(), 0, "nothing consumed on a miss");

    // A read-only grant of a buffer the device must write is not enough.
    grants.grant(mq.buf(0), 64, Perm::Read);
    assert_eq!(dev.available().unwrap(), 2);
    assert!(dev
        .pop_batch(&mut chains, 8, |_| {})
        .unwrap_err()
        .is_retryable());
    assert_eq!(dev.last_avail(), 0);

    // Granted writable: the chain comes out and its bytes land where the peer sees them.
    grants.grant(mq.buf(0), 64, Perm::Write);
    grants.grant(mq.buf(1), 64, Perm::ReadWrite);
    assert_eq!(dev.available().unwrap(), 2);
    assert_eq!(dev.pop_batch(&mut chains, 8, |_| {}).unwrap(), 2);
    write_segs(dev.writable(&chains[0]), 0, b"granted!");
    let mut b = [0u8; 8];
    mq.peek(mq.buf(0), &mut b);
    assert_eq!(&b, b"granted!");
    assert!(grants.misses.load(Ordering::Relaxed) >= 2);

    // Revoking the used ring: the next batch re-translates the rings and waits for it.
    grants.revoke(mq.addrs.used);
    assert!(dev.available().unwrap_err().is_retryable());
    grants.grant(mq.addrs.used, ul, Perm::ReadWrite);
    assert_eq!(dev.available().unwrap(), 0);

    // The region table, by contrast, calls a miss a violation.
    let e = mq.mem.miss_error(Miss {
        addr: 1,
        len: 1,
        perm: Perm::Read,
    });
    assert!(!e.is_retryable());
}

/// The IOTLB itself ([`Iotlb`] snapshots as [`MemTable::granted`]): the device reaches
/// exactly what was granted, with the permission granted; a revoked range is refused from
/// the next batch on; rings granted page by page translate as one range.
#[test]
fn an_iotlb_snapshot_grants_exactly_what_was_granted() {
    let mq = MockQueue::new(8, 64);
    let (mut drv, _) = mq
        .pair_in(Format::Split, Direction::DeviceWrites, true)
        .unwrap();
    // IOVA = GPA here; the grant names the frontend's user address, as vhost-user does.
    let uaddr = |gpa: u64| gpa - virtq::mock::GPA_BASE + 0x7f00_0000_0000;
    let grant = |t: &mut Iotlb, iova: u64, len: u64, perm| {
        t.update(Grant {
            iova,
            len,
            uaddr: uaddr(iova),
            perm,
        })
        .unwrap();
    };
    let snap = |t: &Iotlb| Arc::new(MemTable::granted(&mq.mem, &t.grants()).unwrap());
    let mut t = Iotlb::new(64);
    let (dl, al, ul) = virtq::split::ring_sizes(8);
    // The descriptor table in two pieces, as a vIOMMU grants it page by page.
    grant(&mut t, mq.addrs.desc, dl / 2, Perm::Read);
    grant(&mut t, mq.addrs.desc + dl / 2, dl / 2, Perm::Read);
    grant(&mut t, mq.addrs.avail, al, Perm::Read);
    grant(&mut t, mq.addrs.used, ul, Perm::ReadWrite);
    let mut cfg = mq.config(Direction::DeviceWrites, true, true);
    cfg.space = AddrSpace::User; // ignored under an IOTLB: ring addresses are IOVAs
    let mut dev = DeviceQueue::new(snap(&t), &cfg).unwrap();
    offer(&mut drv, &mq, 0..2, true);

    // Not granted: retryable, nothing consumed.
    let mut chains = Vec::new();
    assert_eq!(dev.available().unwrap(), 2);
    assert!(dev
        .pop_batch(&mut chains, 8, |_| {})
        .unwrap_err()
        .is_retryable());
    assert_eq!(dev.last_avail(), 0);

    // Granted read-only: writing there is refused for good.
    grant(&mut t, mq.buf(0), 64, Perm::Read);
    dev.set_mem(snap(&t)).unwrap();
    assert_eq!(dev.available().unwrap(), 2);
    let e = dev.pop_batch(&mut chains, 8, |_| {}).unwrap_err();
    assert!(matches!(e, Error::AccessDenied { .. }), "{e}");
    assert!(!e.is_retryable());

    // Granted writable: the bytes land where the peer sees them.
    grant(&mut t, mq.buf(0), 64, Perm::Write);
    grant(&mut t, mq.buf(1), 64, Perm::ReadWrite);
    dev.set_mem(snap(&t)).unwrap();
    assert_eq!(dev.available().unwrap(), 2);
    assert_eq!(dev.pop_batch(&mut chains, 8, |_| {}).unwrap(), 2);
    write_segs(dev.writable(&chains[0]), 0, b"granted!");
    let mut b = [0u8; 8];
    mq.peek(mq.buf(0), &mut b);
    assert_eq!(&b, b"granted!");
    dev.push_used(chains[0].head, 8);
    dev.push_used(chains[1].head, 0);
    dev.publish();
    drop(chains);

    // Revoked: the next chain naming it waits; the snapshot refuses the range.
    offer(&mut drv, &mq, 0..1, true);
    assert!(t.invalidate(mq.buf(0), 64));
    let s = snap(&t);
    let mut hint = 0;
    assert!(s.translate(mq.buf(0), Perm::Write, &mut hint).is_err());
    assert!(s.translate(mq.buf(1), Perm::Write, &mut hint).is_ok());
    dev.set_mem(s).unwrap();
    let mut chains = Vec::new();
    assert_eq!(dev.available().unwrap(), 1);
    assert!(dev
        .pop_batch(&mut chains, 8, |_| {})
        .unwrap_err()
        .is_retryable());

    // A ring revoked: the queue cannot be translated until it is granted again.
    assert!(t.invalidate(mq.addrs.used, ul));
    assert!(dev.set_mem(snap(&t)).unwrap_err().is_retryable());
    // A grant of memory the peer never shared cannot be turned into a snapshot.
    t.update(Grant {
        iova: 0x9000_0000,
        len: 8,
        uaddr: 0x10,
        perm: Perm::Read,
    })
    .unwrap();
    assert!(!mq.mem.covers_user(0x10, 8));
    assert!(MemTable::granted(&mq.mem, &t.grants()).is_err());
}

/// A backend killed mid-run, and a new one started on the same rings with base 0 (what DPDK's
/// virtio-user sends after a reconnection): the new device resumes from the ring's used index,
/// so the chains the dead device took but never returned are taken again, the ones it returned
/// are not, and the driver gets each buffer back exactly once.
#[test]
fn a_restarted_device_resumes_from_the_used_index() {
    let mq = MockQueue::new(16, 64);
    let (mut drv, mut dead) = mq
        .pair_in(Format::Split, Direction::DeviceReads, true)
        .unwrap();
    offer(&mut drv, &mq, 0..6, false);
    let mut chains = Vec::new();
    assert_eq!(dead.available().unwrap(), 6);
    assert_eq!(dead.pop_batch(&mut chains, 16, |_| {}).unwrap(), 6);
    // It returned four of the six, then died (no GET_VRING_BASE: its position is lost).
    for c in &chains[..4] {
        dead.push_used(c.head, 0);
    }
    dead.publish();
    drop(dead);
    let cfg = QueueConfig {
        base: 0,
        ..mq.config(Direction::DeviceReads, true, true)
    };
    let mut dev = DeviceQueue::new(mq.mem.clone(), &cfg).unwrap();
    assert_eq!(dev.resume_from_used(), Some((0, 4)));
    assert_eq!(dev.resume_from_used(), None, "once in step, nothing to do");
    assert_eq!(dev.last_avail(), 4);
    assert_eq!(
        dev.available().unwrap(),
        2,
        "the two taken but never returned"
    );
    let mut again = Vec::new();
    assert_eq!(dev.pop_batch(&mut again, 16, |_| {}).unwrap(), 2);
    let mut first = [0u8; 8];
    read_segs(dev.readable(&again[0]), 0, &mut first);
    assert_eq!(first[0], 4, "the first chain not returned comes first");
    for c in &again {
        dev.push_used(c.head, 0);
    }
    dev.publish();
    assert_eq!(drv.used_available().unwrap(), 6);
    let mut ids = Vec::new();
    while let Some((id, _)) = drv.pop_used().unwrap() {
        ids.push(id);
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..6).collect::<Vec<_>>(), "each buffer back once");
}
