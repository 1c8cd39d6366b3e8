//! Property tests: random operation sequences through both roles of a split virtqueue
//! (driver [`DriverQueue`] and device [`DeviceQueue`] over one [`MockQueue`]), checked step by
//! step against a simple model.
//!
//! The model keeps every index as a free-running `u64` position (0 = the queue's `base`), so
//! it never wraps; the queues under test run on 16-bit indices starting at `base`, which the
//! strategies put near 65535 so that the real indices wrap within a few operations.
//!
//! Checked after every operation:
//! * chains come out of the device in the order the driver published them (FIFO), with the
//!   head id, readable and writable totals the driver added;
//! * bytes the driver wrote are read intact by the device, bytes the device wrote are read
//!   intact by the driver, and nothing past the used length is touched;
//! * used entries come back to the driver in the order the device published them, with the
//!   ids and lengths the device pushed; free counts and in-flight counts restore;
//! * every notification decision (`publish` on both sides, `arm_*` results) equals the
//!   model's, and in particular: after a side armed and got `Armed::Empty`, the peer's next
//!   publish of new entries returns true (no lost notification), and a side that disabled
//!   notifications is not notified once its event index was passed (event_idx, no wrap) or
//!   at all (flags).

use proptest::prelude::*;
use std::collections::VecDeque;
use virtq::mock::MockQueue;
use virtq::split::{Buf, DeviceQueue, Direction, DriverQueue};
use virtq::Error;
use virtq::{need_event, Armed};
use virtq::{read_segs, write_segs};

/// Bytes per mock buffer (each descriptor uses one buffer slot).
const BUF: u32 = 64;
/// Fill of writable bytes the device did not write.
const POISON: u8 = 0xa5;

/// Low 16 bits of a model position.
fn low16(pos: u64) -> u16 {
    u16::try_from(pos & 0xffff).expect("masked")
}

/// Pattern of byte `i` of the data the driver sends in chain `seq`.
fn pat_out(seq: u64, i: usize) -> u8 {
    (seq.wrapping_mul(0x9e37_79b9) ^ (i as u64).wrapping_mul(0x45)).to_le_bytes()[1]
}

/// Pattern of byte `i` of the data the device returns in chain `seq`.
fn pat_in(seq: u64, i: usize) -> u8 {
    (seq.wrapping_mul(0x85eb_ca6b) ^ (i as u64).wrapping_mul(0x1d)).to_le_bytes()[2]
}

#[derive(Debug, Clone)]
enum Op {
    /// Driver adds buffers of these lengths: one chain if `chain`, else one chain per buffer.
    /// On a Mixed queue the first `nread` are readable.
    Add {
        lens: Vec<u32>,
        chain: bool,
        nread: usize,
    },
    /// Driver publishes what it added.
    Publish,
    /// Device pops up to `max` chains, starting a new batch first if `reload`; on writable
    /// chains it writes `fill`/255 of the writable bytes.
    Pop {
        max: usize,
        reload: bool,
        fill: u8,
    },
    /// Device pushes up to `n` popped chains as used, choosing which with `pick` (out of order).
    PushUsed {
        n: usize,
        pick: usize,
    },
    /// Device publishes its used entries.
    DevPublish,
    /// Driver reclaims up to `max` used buffers, reloading `used->idx` first if `reload`.
    Reclaim {
        max: usize,
        reload: bool,
    },
    DevArm,
    DevDisable,
    DrvArm,
    DrvDisable,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let len = prop_oneof![1 => Just(0u32), 9 => 1..=BUF];
    prop_oneof![
        6 => (prop::collection::vec(len, 1..=5), any::<bool>(), 0usize..=5)
            .prop_map(|(lens, chain, nread)| Op::Add { lens, chain, nread }),
        4 => Just(Op::Publish),
        5 => (1usize..=8, prop::bool::weighted(0.7), any::<u8>())
            .prop_map(|(max, reload, fill)| Op::Pop { max, reload, fill }),
        4 => (1usize..=8, any::<usize>()).prop_map(|(n, pick)| Op::PushUsed { n, pick }),
        4 => Just(Op::DevPublish),
        5 => (1usize..=8, prop::bool::weighted(0.7))
            .prop_map(|(max, reload)| Op::Reclaim { max, reload }),
        2 => Just(Op::DevArm),
        2 => Just(Op::DevDisable),
        2 => Just(Op::DrvArm),
        2 => Just(Op::DrvDisable),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Cfg {
    size: u16,
    dir: Direction,
    event_idx: bool,
    base: u16,
}

fn cfg_strategy() -> impl Strategy<Value = Cfg> {
    let size = prop_oneof![Just(2u16), Just(4), Just(8), Just(16)];
    let dir = prop_oneof![
        Just(Direction::DeviceReads),
        Just(Direction::DeviceWrites),
        Just(Direction::Mixed)
    ];
    // Mostly near the 16-bit wrap, so that indices wrap inside a short run.
    let base = prop_oneof![2 => Just(0u16), 5 => 0xfff0u16..=0xffff, 1 => any::<u16>()];
    (size, dir, any::<bool>(), base).prop_map(|(size, dir, event_idx, base)| Cfg {
        size,
        dir,
        event_idx,
        base,
    })
}

/// A chain as the driver added it.
#[derive(Debug, Clone)]
struct ChainM {
    seq: u64,
    head: u16,
    /// (buffer slot, buffer) in chain order.
    bufs: Vec<(u16, Buf)>,
    readable: u32,
    writable: u32,
}

struct Harness {
    cfg: Cfg,
    mq: MockQueue,
    drv: DriverQueue,
    dev: DeviceQueue,
    seq: u64,
    // Buffer pool and descriptors.
    free_slots: Vec<u16>,
    free_descs: usize,
    heads_in_flight: Vec<bool>,
    // Driver -> device.
    added: VecDeque<ChainM>,
    visible: VecDeque<ChainM>,
    avail_pos: u64,
    published_pos: u64,
    consumed_pos: u64,
    batch_end: u64,
    // Device -> driver.
    popped: Vec<(ChainM, u32)>,
    pushed: Vec<(ChainM, u32)>,
    used_pos: u64,
    used_published_pos: u64,
    used_visible: VecDeque<(ChainM, u32)>,
    last_used_pos: u64,
    used_cache_pos: u64,
    // Notification state as the model sees it.
    avail_event: u64,
    dev_notify_on: bool,
    dev_armed_empty: bool,
    used_event: u64,
    drv_irq_on: bool,
    drv_armed_empty: bool,
    dev_signalled_valid: bool,
    stats: Stats,
}

/// What a run went through, to check that the interesting cases are reached.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    kicks: u64,
    kicks_suppressed: u64,
    calls: u64,
    calls_suppressed: u64,
    kick_after_armed_empty: u64,
    call_after_armed_empty: u64,
    no_free: u64,
    multi_buf_chains: u64,
    out_of_order_used: u64,
    avail_wraps: u64,
    used_wraps: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.kicks += o.kicks;
        self.kicks_suppressed += o.kicks_suppressed;
        self.calls += o.calls;
        self.calls_suppressed += o.calls_suppressed;
        self.kick_after_armed_empty += o.kick_after_armed_empty;
        self.call_after_armed_empty += o.call_after_armed_empty;
        self.no_free += o.no_free;
        self.multi_buf_chains += o.multi_buf_chains;
        self.out_of_order_used += o.out_of_order_used;
        self.avail_wraps += o.avail_wraps;
        self.used_wraps += o.used_wraps;
    }
}

impl Harness {
    fn new(cfg: Cfg) -> Self {
        let mq = MockQueue::new(cfg.size, BUF);
        let mut qc = mq.config(cfg.dir, cfg.event_idx, false);
        qc.base = cfg.base;
        let drv = DriverQueue::new(mq.mem.clone(), &qc).expect("driver");
        let dev = DeviceQueue::new(mq.mem.clone(), &qc).expect("device");
        let n = usize::from(cfg.size);
        Self {
            cfg,
            mq,
            drv,
            dev,
            seq: 0,
            free_slots: (0..cfg.size).rev().collect(),
            free_descs: n,
            heads_in_flight: vec![false; n],
            added: VecDeque::new(),
            visible: VecDeque::new(),
            avail_pos: 0,
            published_pos: 0,
            consumed_pos: 0,
            batch_end: 0,
            popped: Vec::new(),
            pushed: Vec::new(),
            used_pos: 0,
            used_published_pos: 0,
            used_visible: VecDeque::new(),
            last_used_pos: 0,
            used_cache_pos: 0,
            avail_event: 0,
            dev_notify_on: true,
            dev_armed_empty: false,
            used_event: 0,
            drv_irq_on: true,
            drv_armed_empty: false,
            dev_signalled_valid: false,
            stats: Stats::default(),
        }
    }

    fn chains_in_flight(&self) -> usize {
        self.heads_in_flight.iter().filter(|&&b| b).count()
    }

    fn is_write(&self, k: usize, nread: usize) -> bool {
        match self.cfg.dir {
            Direction::DeviceReads => false,
            Direction::DeviceWrites => true,
            Direction::Mixed => k >= nread,
        }
    }

    /// Takes a buffer slot and fills it: the pattern for readable bytes, poison for writable.
    fn prepare(&mut self, seq: u64, out_off: &mut usize, len: u32, write: bool) -> (u16, Buf) {
        let slot = self.free_slots.pop().expect("a slot per free descriptor");
        let addr = self.mq.buf(slot);
        let bytes: Vec<u8> = if write {
            vec![POISON; BUF as usize]
        } else {
            let v = (0..len as usize)
                .map(|i| pat_out(seq, *out_off + i))
                .collect();
            *out_off += len as usize;
            v
        };
        self.mq.poke(addr, &bytes);
        (slot, Buf { addr, len, write })
    }

    fn add(&mut self, lens: &[u32], chain: bool, nread: usize) {
        if chain {
            if lens.len() > self.free_descs {
                let bufs: Vec<Buf> = lens
                    .iter()
                    .map(|&len| Buf {
                        addr: self.mq.buf(0),
                        len,
                        write: false,
                    })
                    .collect();
                assert_eq!(self.drv.add_chain(&bufs), Err(Error::NoFreeDescriptors));
                self.stats.no_free += 1;
                return;
            }
            self.seq += 1;
            let seq = self.seq;
            let mut off = 0;
            let bufs: Vec<(u16, Buf)> = lens
                .iter()
                .enumerate()
                .map(|(k, &len)| {
                    let w = self.is_write(k, nread);
                    self.prepare(seq, &mut off, len, w)
                })
                .collect();
            let plain: Vec<Buf> = bufs.iter().map(|b| b.1).collect();
            let head = self
                .drv
                .add_chain(&plain)
                .expect("add_chain with free descriptors");
            self.added_chain(seq, head, bufs);
        } else {
            for (k, &len) in lens.iter().enumerate() {
                let w = self.is_write(k, nread);
                if self.free_descs == 0 {
                    let b = Buf {
                        addr: self.mq.buf(0),
                        len,
                        write: w,
                    };
                    assert_eq!(self.drv.add_one(b), Err(Error::NoFreeDescriptors));
                    self.stats.no_free += 1;
                    break;
                }
                self.seq += 1;
                let seq = self.seq;
                let mut off = 0;
                let b = self.prepare(seq, &mut off, len, w);
                let head = self
                    .drv
                    .add_one(b.1)
                    .expect("add_one with a free descriptor");
                self.added_chain(seq, head, vec![b]);
            }
        }
        assert_eq!(self.drv.free_count(), self.free_descs);
    }

    fn added_chain(&mut self, seq: u64, head: u16, bufs: Vec<(u16, Buf)>) {
        assert!(head < self.cfg.size);
        assert!(
            !self.heads_in_flight[usize::from(head)],
            "head {head} handed out twice"
        );
        self.heads_in_flight[usize::from(head)] = true;
        self.free_descs -= bufs.len();
        self.stats.multi_buf_chains += u64::from(bufs.len() > 1);
        let readable = bufs.iter().filter(|b| !b.1.write).map(|b| b.1.len).sum();
        let writable = bufs.iter().filter(|b| b.1.write).map(|b| b.1.len).sum();
        self.added.push_back(ChainM {
            seq,
            head,
            bufs,
            readable,
            writable,
        });
        self.avail_pos += 1;
        assert_eq!(
            usize::from(self.drv.in_flight()),
            self.chains_in_flight(),
            "driver in-flight count"
        );
    }

    fn publish(&mut self) {
        let (old, new) = (self.published_pos, self.avail_pos);
        let expect = if old == new {
            false
        } else if self.cfg.event_idx {
            (old..new).contains(&self.avail_event)
        } else {
            self.dev_notify_on
        };
        let kick = self.drv.publish();
        assert_eq!(kick, expect, "driver kick decision (old {old}, new {new})");
        if new != old {
            if self.dev_armed_empty {
                assert!(
                    kick,
                    "device armed and saw an empty ring: the kick was lost"
                );
                self.stats.kick_after_armed_empty += 1;
                self.dev_armed_empty = false;
            }
            if !self.dev_notify_on && (!self.cfg.event_idx || self.avail_event < old) {
                assert!(!kick, "device disabled notifications but was kicked");
            }
        }
        self.stats.kicks += u64::from(kick);
        self.stats.kicks_suppressed += u64::from(!kick && new != old);
        self.stats.avail_wraps +=
            u64::from(new != old && self.cfg.base.checked_add(low16(new)).is_none());
        self.visible.extend(self.added.drain(..));
        self.published_pos = new;
    }

    fn pop(&mut self, max: usize, reload: bool, fill: u8) {
        if reload {
            let n = self.dev.available().expect("well-formed ring");
            assert_eq!(u64::from(n), self.published_pos - self.consumed_pos);
            self.batch_end = self.published_pos;
        } else {
            assert_eq!(
                u64::from(self.dev.pending()),
                self.batch_end - self.consumed_pos
            );
        }
        for _ in 0..max {
            let Some(c) = self.dev.pop().expect("well-formed chain") else {
                assert_eq!(
                    self.consumed_pos, self.batch_end,
                    "pop ended the batch early"
                );
                break;
            };
            let m = self
                .visible
                .pop_front()
                .expect("device popped a chain the driver did not publish");
            assert!(self.consumed_pos < self.batch_end);
            assert_eq!(c.head, m.head, "FIFO order of chains");
            assert_eq!((c.readable, c.writable), (m.readable, m.writable));
            let nonempty = m.bufs.iter().filter(|b| b.1.len > 0).count();
            assert_eq!(self.dev.segs(&c).len(), nonempty, "one segment per buffer");
            // Device reads what the driver wrote.
            let mut data = vec![0u8; c.readable as usize];
            assert_eq!(read_segs(self.dev.readable(&c), 0, &mut data), data.len());
            for (i, &b) in data.iter().enumerate() {
                assert_eq!(b, pat_out(m.seq, i), "readable byte {i} of chain {}", m.seq);
            }
            // Device writes some of the writable bytes.
            let len = u32::try_from(u64::from(c.writable) * u64::from(fill) / 255).expect("<=");
            let out: Vec<u8> = (0..len as usize).map(|i| pat_in(m.seq, i)).collect();
            assert_eq!(write_segs(self.dev.writable(&c), 0, &out), out.len());
            self.consumed_pos += 1;
            self.popped.push((m, len));
        }
        assert_eq!(
            self.dev.last_avail(),
            self.cfg.base.wrapping_add(low16(self.consumed_pos))
        );
    }

    fn push_used(&mut self, n: usize, pick: usize) {
        for _ in 0..n {
            if self.popped.is_empty() {
                break;
            }
            let i = pick % self.popped.len();
            self.stats.out_of_order_used += u64::from(i != 0);
            let (m, len) = self.popped.remove(i);
            self.dev.push_used(m.head, len);
            self.pushed.push((m, len));
            self.used_pos += 1;
        }
        assert_eq!(
            self.dev.used_idx(),
            self.cfg.base.wrapping_add(low16(self.used_pos))
        );
    }

    fn dev_publish(&mut self) {
        let (old, new) = (self.used_published_pos, self.used_pos);
        let expect = if old == new {
            false
        } else if self.cfg.event_idx {
            !self.dev_signalled_valid || (old..new).contains(&self.used_event)
        } else {
            self.drv_irq_on
        };
        let call = self.dev.publish();
        assert_eq!(call, expect, "device call decision (old {old}, new {new})");
        if new != old {
            if self.drv_armed_empty {
                assert!(
                    call,
                    "driver armed and saw no used entries: the call was lost"
                );
                self.stats.call_after_armed_empty += 1;
                self.drv_armed_empty = false;
            }
            // With event_idx a disabled driver's used_event sits half the index space ahead,
            // which no publish reaches before the index wraps.
            if self.dev_signalled_valid && !self.drv_irq_on {
                assert!(!call, "driver disabled interrupts but was called");
            }
            self.dev_signalled_valid = true;
        }
        self.stats.calls += u64::from(call);
        self.stats.calls_suppressed += u64::from(!call && new != old);
        self.stats.used_wraps +=
            u64::from(new != old && self.cfg.base.checked_add(low16(new)).is_none());
        self.used_visible.extend(self.pushed.drain(..));
        self.used_published_pos = new;
    }

    fn reclaim(&mut self, max: usize, reload: bool) {
        if reload {
            let n = self.drv.used_available().expect("well-formed used ring");
            assert_eq!(u64::from(n), self.used_published_pos - self.last_used_pos);
            self.used_cache_pos = self.used_published_pos;
        }
        for _ in 0..max {
            let Some((id, len)) = self.drv.pop_used().expect("valid used entry") else {
                assert_eq!(self.last_used_pos, self.used_cache_pos);
                break;
            };
            let (m, l) = self
                .used_visible
                .pop_front()
                .expect("driver reclaimed an entry the device did not publish");
            assert_eq!((id, len), (m.head, l), "used entries in device order");
            // Driver reads what the device wrote, and nothing past `len` changed.
            let mut got = Vec::new();
            for (slot, b) in m.bufs.iter().filter(|b| b.1.write) {
                let mut v = vec![0u8; b.len as usize];
                self.mq.peek(self.mq.buf(*slot), &mut v);
                got.extend_from_slice(&v);
            }
            for (i, &b) in got.iter().enumerate() {
                let want = if i < len as usize {
                    pat_in(m.seq, i)
                } else {
                    POISON
                };
                assert_eq!(b, want, "writable byte {i} of chain {} (len {len})", m.seq);
            }
            self.free_slots.extend(m.bufs.iter().map(|b| b.0));
            self.free_descs += m.bufs.len();
            self.heads_in_flight[usize::from(m.head)] = false;
            self.last_used_pos += 1;
        }
        assert_eq!(
            self.drv.free_count(),
            self.free_descs,
            "free count restores"
        );
        assert_eq!(usize::from(self.drv.in_flight()), self.chains_in_flight());
    }

    fn dev_arm(&mut self) {
        let a = self.dev.arm_notify().expect("well-formed ring");
        let pending = self.published_pos > self.consumed_pos;
        assert_eq!(a == Armed::NotEmpty, pending, "device arm re-check");
        self.avail_event = self.consumed_pos;
        self.dev_notify_on = true;
        self.batch_end = self.published_pos;
        self.dev_armed_empty = a == Armed::Empty;
    }

    fn dev_disable(&mut self) {
        self.dev.disable_notify();
        self.dev_notify_on = false;
        self.dev_armed_empty = false;
    }

    fn drv_arm(&mut self) {
        let a = self.drv.arm_used_notify().expect("well-formed used ring");
        let pending = self.used_published_pos > self.last_used_pos;
        assert_eq!(a == Armed::NotEmpty, pending, "driver arm re-check");
        self.used_event = self.last_used_pos;
        self.drv_irq_on = true;
        self.used_cache_pos = self.used_published_pos;
        self.drv_armed_empty = a == Armed::Empty;
    }

    fn drv_disable(&mut self) {
        self.drv.disable_used_notify();
        if self.drv_irq_on && self.cfg.event_idx {
            self.used_event = self.last_used_pos + 0x8000;
        }
        self.drv_irq_on = false;
        self.drv_armed_empty = false;
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Add { lens, chain, nread } => self.add(lens, *chain, *nread),
            Op::Publish => self.publish(),
            Op::Pop { max, reload, fill } => self.pop(*max, *reload, *fill),
            Op::PushUsed { n, pick } => self.push_used(*n, *pick),
            Op::DevPublish => self.dev_publish(),
            Op::Reclaim { max, reload } => self.reclaim(*max, *reload),
            Op::DevArm => self.dev_arm(),
            Op::DevDisable => self.dev_disable(),
            Op::DrvArm => self.drv_arm(),
            Op::DrvDisable => self.drv_disable(),
        }
    }

    /// Finishes everything in flight and checks the queue is back to its initial shape.
    fn drain(&mut self) {
        let size = usize::from(self.cfg.size);
        self.publish();
        self.pop(size, true, 255);
        self.push_used(size, 0);
        self.dev_publish();
        self.reclaim(size, true);
        assert!(self.visible.is_empty() && self.popped.is_empty());
        assert!(self.used_visible.is_empty() && self.added.is_empty());
        assert_eq!(self.drv.free_count(), size);
        assert_eq!(self.drv.in_flight(), 0);
        assert_eq!(self.free_slots.len(), size);
        assert_eq!(self.dev.pending(), 0);
        assert_eq!(self.dev.available(), Ok(0));
        assert_eq!(self.drv.used_available(), Ok(0));
    }
}

proptest! {
    // 512 cases by default (about a second in debug); PROPTEST_CASES=N for longer runs.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512)
    ))]

    #[test]
    fn random_operations_match_model(
        cfg in cfg_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..160),
    ) {
        let mut h = Harness::new(cfg);
        for op in &ops {
            h.apply(op);
        }
        h.drain();
    }

    /// `need_event` is "event lies in [old, new)" on the 16-bit circle.
    #[test]
    fn need_event_is_interval_membership(event in any::<u16>(), old in any::<u16>(), step in 0u16..=0x8000) {
        let new = old.wrapping_add(step);
        let inside = event.wrapping_sub(old) < step;
        prop_assert_eq!(need_event(event, new, old), inside);
    }

    /// Shifting all three indices by the same amount never changes the answer (wrap-invariance).
    #[test]
    fn need_event_is_shift_invariant(event in any::<u16>(), old in any::<u16>(), new in any::<u16>(), k in any::<u16>()) {
        prop_assert_eq!(
            need_event(event, new, old),
            need_event(event.wrapping_add(k), new.wrapping_add(k), old.wrapping_add(k))
        );
    }
}

/// The random runs reach every case the properties talk about (a fixed-seed sample).
#[test]
fn model_reaches_interesting_states() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = (cfg_strategy(), prop::collection::vec(op_strategy(), 1..160));
    let mut total = Stats::default();
    for _ in 0..200 {
        let (cfg, ops) = strat.new_tree(&mut runner).expect("tree").current();
        let mut h = Harness::new(cfg);
        for op in &ops {
            h.apply(op);
        }
        h.drain();
        total.add(&h.stats);
    }
    let t = total;
    for (what, n) in [
        ("kicks", t.kicks),
        ("suppressed kicks", t.kicks_suppressed),
        ("calls", t.calls),
        ("suppressed calls", t.calls_suppressed),
        ("kicks after Armed::Empty", t.kick_after_armed_empty),
        ("calls after Armed::Empty", t.call_after_armed_empty),
        ("no free descriptors", t.no_free),
        ("multi-buffer chains", t.multi_buf_chains),
        ("out-of-order used", t.out_of_order_used),
        ("avail index wraps", t.avail_wraps),
        ("used index wraps", t.used_wraps),
    ] {
        assert!(n > 0, "never reached: {what} ({t:?})");
    }
}

/// Exhaustive over every index near the wrap: compare with a 32-bit, non-wrapping model.
#[test]
fn need_event_exhaustive_near_wrap() {
    for old32 in 0xffe0u32..0x1_0020 {
        for step in 0u32..40 {
            let new32 = old32 + step;
            for event32 in old32.saturating_sub(40)..new32 + 40 {
                let want = (old32..new32).contains(&event32);
                let t = |v: u32| u16::try_from(v & 0xffff).expect("masked");
                assert_eq!(
                    need_event(t(event32), t(new32), t(old32)),
                    want,
                    "event {event32:#x} old {old32:#x} new {new32:#x}"
                );
            }
        }
    }
}

#[test]
fn need_event_edges() {
    // Passing the event index exactly once.
    assert!(need_event(7, 8, 7));
    assert!(!need_event(7, 7, 6));
    assert!(need_event(0xffff, 0, 0xffff));
    assert!(need_event(0xffff, 0x10, 0xfff0));
    assert!(!need_event(0xffef, 0x10, 0xfff0));
    assert!(!need_event(0x10, 0x10, 0xfff0));
    // A full 2^15 step around the wrap.
    assert!(need_event(0x7fff, 0x8000, 0));
    assert!(need_event(0xffff, 0x7fff, 0x8000));
    // The driver's "disable" value (half the space ahead) is never crossed by one ring.
    for last in [0u16, 0x1234, 0x7fff, 0x8000, 0xfff0, 0xffff] {
        for step in 0..=256u16 {
            assert!(!need_event(
                last.wrapping_add(0x8000),
                last.wrapping_add(step),
                last
            ));
        }
    }
}

/// More than 2^16 single-buffer round trips on a tiny queue, so the real indices wrap
/// naturally from 0; notifications stay armed on both sides so every publish must notify.
#[test]
fn long_run_wraps_naturally() {
    for (dir, event_idx) in [
        (Direction::DeviceReads, true),
        (Direction::DeviceWrites, false),
    ] {
        let mq = MockQueue::new(4, 64);
        let (mut drv, mut dev) = mq.pair(dir, event_idx).expect("pair");
        let write = dir == Direction::DeviceWrites;
        for i in 0..70_000u32 {
            let k = u16::try_from(i % 4).expect("small");
            let tag = i.to_le_bytes();
            if !write {
                mq.poke(mq.buf(k), &tag);
            }
            let id = drv
                .add_one(Buf {
                    addr: mq.buf(k),
                    len: 4,
                    write,
                })
                .expect("free");
            assert!(drv.publish(), "device armed at its last_avail: kick {i}");
            assert_eq!(dev.available(), Ok(1));
            let c = dev.pop().expect("valid").expect("one chain");
            assert_eq!(c.head, id);
            let mut b = [0u8; 4];
            if write {
                write_segs(dev.writable(&c), 0, &tag);
            } else {
                read_segs(dev.readable(&c), 0, &mut b);
                assert_eq!(b, tag);
            }
            dev.push_used(c.head, if write { 4 } else { 0 });
            assert_eq!(dev.arm_notify(), Ok(Armed::Empty));
            assert!(dev.publish(), "driver armed at its last_used: call {i}");
            assert_eq!(drv.used_available(), Ok(1));
            let (uid, len) = drv.pop_used().expect("valid").expect("one entry");
            assert_eq!(uid, id);
            if write {
                assert_eq!(len, 4);
                mq.peek(mq.buf(k), &mut b);
                assert_eq!(b, tag);
            }
            assert_eq!(drv.arm_used_notify(), Ok(Armed::Empty));
        }
        assert_eq!(dev.last_avail(), low16(70_000));
        assert_eq!(dev.used_idx(), low16(70_000));
        assert_eq!(drv.free_count(), 4);
    }
}

/// A zero-length buffer has no segment, whichever parse path takes it (the one-descriptor
/// fast path or the general walk of a chain), and wherever its address points.
#[test]
fn zero_length_buffers_have_no_segments() {
    let mq = MockQueue::new(8, 64);
    let (mut drv, mut dev) = mq.pair(Direction::Mixed, false).expect("pair");
    let b = |addr, len, write| Buf { addr, len, write };
    drv.add_one(b(mq.buf(0), 0, false)).expect("free");
    drv.add_one(b(mq.buf(1), 0, true)).expect("free");
    drv.add_one(b(0, 0, false)).expect("free");
    drv.add_chain(&[b(mq.buf(2), 0, false), b(mq.buf(3), 8, true)])
        .expect("free");
    drv.add_chain(&[b(mq.buf(4), 8, false), b(mq.buf(5), 0, true)])
        .expect("free");
    assert!(drv.publish());
    assert_eq!(dev.available(), Ok(5));
    let mut shapes = Vec::new();
    while let Some(c) = dev.pop().expect("valid") {
        assert!(dev.segs(&c).iter().all(|s| !s.is_empty()), "empty segment");
        shapes.push((
            c.readable,
            c.writable,
            dev.readable(&c).len(),
            dev.writable(&c).len(),
        ));
    }
    assert_eq!(
        shapes,
        [
            (0, 0, 0, 0),
            (0, 0, 0, 0),
            (0, 0, 0, 0),
            (0, 8, 0, 1),
            (8, 0, 1, 0)
        ]
    );
}

/// With event_idx, a device that polls (notifications disabled, its old `avail_event` already
/// passed) is not kicked again until the 16-bit index comes round: the "no wrap" caveat.
#[test]
fn disabled_event_idx_kick_comes_back_only_after_wrap() {
    let mq = MockQueue::new(4, 64);
    let (mut drv, mut dev) = mq.pair(Direction::DeviceReads, true).expect("pair");
    let mut kicks = Vec::new();
    dev.disable_notify();
    for i in 0..0x1_0004u32 {
        drv.add_one(Buf {
            addr: mq.buf(0),
            len: 4,
            write: false,
        })
        .expect("free");
        if drv.publish() {
            kicks.push(i);
        }
        assert_eq!(dev.available(), Ok(1));
        let c = dev.pop().expect("valid").expect("chain");
        dev.push_used(c.head, 0);
        let _ = dev.publish();
        assert_eq!(drv.used_available(), Ok(1));
        drv.pop_used().expect("valid").expect("entry");
    }
    // avail_event stayed at 0: crossed by the first publish and again after 2^16 entries.
    assert_eq!(kicks, [0, 0x1_0000]);
}
