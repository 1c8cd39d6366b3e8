//! The ring-format seam: one device-queue and one driver-queue type over every ring format.
//!
//! The dataplane and the vhost-user glue name only [`DeviceQueue`] and [`DriverQueue`]; the
//! format is chosen once, when the queue is built ([`QueueConfig::format`], from the
//! negotiated features). Each method branches on the format once per call, and the calls are
//! per batch or per chain, never per byte: with one format the branch folds away.
//!
//! The contract every format keeps (and `tests/seams.rs` checks for each one):
//! * `available` loads the driver's index once per batch; `pop`/`pop_batch` parse chains up
//!   to it, reading each descriptor once and validating it; `unpop` gives back the last
//!   chains popped, unconsumed;
//! * `push_used` records, `publish` makes a batch visible with one release store and takes
//!   one notification decision;
//! * `arm_notify` is arm, fence, re-check; `disable_notify` is a hint;
//! * `last_avail` is what `GET_VRING_BASE` returns and `QueueConfig::base` takes back.
//!
//! The vocabulary the formats share ([`Format`], [`Direction`], [`RingAddrs`], [`QueueConfig`],
//! [`Buf`]) lives in [`crate::config`], below the formats; this facade re-exports it, so callers
//! name it here.

use crate::chain::Chain;
use crate::error::Result;
use crate::event::Armed;
use crate::mem::{MemTable, Seg};
use crate::xlate::Translate;
use crate::{packed, split};
use std::sync::Arc;

use crate::config::{Buf, Format, QueueConfig};

/// Forwards a method to the queue of whatever format it is.
macro_rules! dispatch {
    ($self:ident, $q:ident => $e:expr) => {
        match $self {
            Self::Split($q) => $e,
            Self::Packed($q) => $e,
        }
    };
}

/// What a per-packet loop needs of one format's device queue: a loop generic over it is
/// compiled once per format, and a match on the [`DeviceQueue`] chooses the format once per
/// run instead of once per call.
pub trait FormatQueue {
    /// The device-readable segments of a chain of the current batch.
    fn readable(&self, c: &Chain) -> &[Seg<'_>];
    /// The device-writable segments of a chain of the current batch.
    fn writable(&self, c: &Chain) -> &[Seg<'_>];
    /// Records a used entry (nothing reaches the ring until `publish`).
    fn push_used(&mut self, head: u16, len: u32);
}

macro_rules! format_queue {
    ($t:ty) => {
        impl<M: Translate> FormatQueue for $t {
            #[inline(always)]
            fn readable(&self, c: &Chain) -> &[Seg<'_>] {
                Self::readable(self, c)
            }
            #[inline(always)]
            fn writable(&self, c: &Chain) -> &[Seg<'_>] {
                Self::writable(self, c)
            }
            #[inline(always)]
            fn push_used(&mut self, head: u16, len: u32) {
                Self::push_used(self, head, len);
            }
        }
    };
}
format_queue!(split::DeviceQueue<M>);
format_queue!(packed::DeviceQueue<M>);
// Any format, each call dispatched (for code off the per-burst loops).
format_queue!(DeviceQueue<M>);

/// The device side of a virtqueue, of any format.
#[derive(Debug)]
pub enum DeviceQueue<M: Translate = MemTable> {
    /// A split ring.
    Split(split::DeviceQueue<M>),
    /// A packed ring.
    Packed(packed::DeviceQueue<M>),
}

impl<M: Translate> DeviceQueue<M> {
    /// Starts the device side of a queue in `cfg.format`; ring addresses are validated and
    /// translated once (and again when the translator revokes anything).
    pub fn new(mem: Arc<M>, cfg: &QueueConfig) -> Result<Self> {
        match cfg.format {
            Format::Split => split::DeviceQueue::new(mem, cfg).map(Self::Split),
            Format::Packed => packed::DeviceQueue::new(mem, cfg).map(Self::Packed),
        }
    }

    /// The ring format.
    #[inline]
    pub fn format(&self) -> Format {
        match self {
            Self::Split(_) => Format::Split,
            Self::Packed(_) => Format::Packed,
        }
    }

    /// Queue size.
    #[inline]
    pub fn size(&self) -> u16 {
        dispatch!(self, q => q.size())
    }

    /// Next avail index to consume (what `GET_VRING_BASE` returns).
    #[inline]
    pub fn last_avail(&self) -> u16 {
        dispatch!(self, q => q.last_avail())
    }

    /// Indirect-table entries whose write flag was ignored since the last call, this queue
    /// being one the device only reads (DPDK's packed transmit tables carry it on their header
    /// entry; see the chain module's `table_entry_writable`).
    #[inline]
    pub fn take_write_ignored(&mut self) -> u64 {
        dispatch!(self, q => q.take_write_ignored())
    }

    /// Whether a dirty log is on (live migration): then what the device writes into a buffer
    /// must be marked ([`DeviceQueue::log_written`]). The ring's own writes are marked by the
    /// queue at each publish.
    #[inline(always)]
    pub fn logging(&self) -> bool {
        dispatch!(self, q => q.logging())
    }

    /// Marks the first `len` bytes of `segs` (a chain's writable segments) in the dirty log.
    #[cold]
    pub fn log_written(&self, segs: &[Seg<'_>], len: u32) {
        if let Some(l) = self.mem().dirty_log() {
            l.mark_segs(segs, len);
        }
    }

    /// A split ring resumes from its `used->idx` if that differs from its base (see
    /// `split::DeviceQueue::resume_from_used`); returns `(base, used)` if it did. A packed
    /// ring has no used index: its base (with the wrap counter) is the only record.
    pub fn resume_from_used(&mut self) -> Option<(u16, u16)> {
        match self {
            Self::Split(q) => q.resume_from_used(),
            Self::Packed(_) => None,
        }
    }

    /// The translator the queue goes through.
    #[inline]
    pub fn mem(&self) -> &Arc<M> {
        dispatch!(self, q => q.mem())
    }

    /// Switches to a new translator, re-translating the rings.
    pub fn set_mem(&mut self, mem: Arc<M>) -> Result<()> {
        dispatch!(self, q => q.set_mem(mem))
    }

    /// Starts a batch: loads the driver's index once; returns how many chains are available.
    /// Chains (and their segments) of the previous batch must be finished.
    #[inline(always)]
    pub fn available(&mut self) -> Result<u16> {
        dispatch!(self, q => q.available())
    }

    /// Chains left in the current batch (no memory access).
    #[inline]
    pub fn pending(&self) -> u16 {
        dispatch!(self, q => q.pending())
    }

    /// Parses the next chain of the batch (`None`: the batch is done).
    #[inline(always)]
    pub fn pop(&mut self) -> Result<Option<Chain>> {
        dispatch!(self, q => q.pop())
    }

    /// Pops up to `max` chains into `out`, calling `each` with every chain's segments as it
    /// is parsed. Returns how many were popped.
    #[inline]
    pub fn pop_batch(
        &mut self,
        out: &mut Vec<Chain>,
        max: usize,
        each: impl FnMut(&[Seg<'_>]),
    ) -> Result<usize> {
        dispatch!(self, q => q.pop_batch(out, max, each))
    }

    /// Gives back the last `n` chains popped, unconsumed (backpressure).
    #[inline]
    pub fn unpop(&mut self, n: u16) {
        dispatch!(self, q => q.unpop(n))
    }

    /// The device-readable segments of a chain of the current batch.
    #[inline(always)]
    pub fn readable(&self, c: &Chain) -> &[Seg<'_>] {
        dispatch!(self, q => q.readable(c))
    }

    /// The device-writable segments of a chain of the current batch.
    #[inline(always)]
    pub fn writable(&self, c: &Chain) -> &[Seg<'_>] {
        dispatch!(self, q => q.writable(c))
    }

    /// All segments of a chain: readable ones first.
    #[inline]
    pub fn segs(&self, c: &Chain) -> &[Seg<'_>] {
        dispatch!(self, q => q.segs(c))
    }

    /// Records a used entry (nothing reaches the ring until `publish`).
    #[inline(always)]
    pub fn push_used(&mut self, head: u16, len: u32) {
        dispatch!(self, q => q.push_used(head, len))
    }

    /// Records a used entry of `len` bytes for each of `chains`, in order: the format chosen
    /// once for the run.
    #[inline]
    pub fn push_used_all(&mut self, chains: &[Chain], len: u32) {
        dispatch!(self, q => {
            for c in chains {
                q.push_used(c.head, len);
            }
        })
    }

    /// Used entries pushed and not yet published.
    #[inline]
    pub fn unpublished(&self) -> u16 {
        dispatch!(self, q => q.unpublished())
    }

    /// Publishes the batch's used entries; true if the driver must be notified.
    #[inline(always)]
    pub fn publish(&mut self) -> bool {
        dispatch!(self, q => q.publish())
    }

    /// How far the driver has run past where it asked to be interrupted (`None` when the
    /// format or features cannot tell).
    #[inline]
    pub fn driver_backlog(&self) -> Option<u16> {
        dispatch!(self, q => q.driver_backlog())
    }

    /// Whether the last publish found the driver asleep on everything published before it
    /// (it re-armed at exactly the previous publish's end: it ran dry and waited). Needs
    /// EVENT_IDX; a driver that polls is never idle here.
    #[inline]
    pub fn driver_idle(&self) -> bool {
        dispatch!(self, q => q.driver_idle())
    }

    /// Stops asking for kicks (we are polling).
    #[inline]
    pub fn disable_notify(&mut self) {
        dispatch!(self, q => q.disable_notify())
    }

    /// Arm, fence, re-check: `Armed::Empty` means it is safe to sleep until a kick.
    #[inline]
    pub fn arm_notify(&mut self) -> Result<Armed> {
        dispatch!(self, q => q.arm_notify())
    }
}

/// The driver side of a virtqueue, of any format, over memory we share.
#[derive(Debug)]
pub enum DriverQueue {
    /// A split ring.
    Split(split::DriverQueue),
    /// A packed ring.
    Packed(packed::DriverQueue),
}

impl DriverQueue {
    /// Lays out a fresh queue in `cfg.format` over memory we share with the device.
    pub fn new(mem: Arc<MemTable>, cfg: &QueueConfig) -> Result<Self> {
        match cfg.format {
            Format::Split => split::DriverQueue::new(mem, cfg).map(Self::Split),
            Format::Packed => packed::DriverQueue::new(mem, cfg).map(Self::Packed),
        }
    }

    /// The ring format.
    #[inline]
    pub fn format(&self) -> Format {
        match self {
            Self::Split(_) => Format::Split,
            Self::Packed(_) => Format::Packed,
        }
    }

    /// Queue size.
    #[inline]
    pub fn size(&self) -> u16 {
        dispatch!(self, q => q.size())
    }

    /// Free descriptors.
    #[inline]
    pub fn free_count(&self) -> usize {
        dispatch!(self, q => q.free_count())
    }

    /// The id the next [`add_one`](Self::add_one) will use, if any is free.
    #[inline(always)]
    pub fn next_free(&self) -> Option<u16> {
        dispatch!(self, q => q.next_free())
    }

    /// Buffers the device holds.
    #[inline]
    pub fn in_flight(&self) -> u16 {
        dispatch!(self, q => q.in_flight())
    }

    /// The memory table.
    #[inline]
    pub fn mem(&self) -> &Arc<MemTable> {
        dispatch!(self, q => q.mem())
    }

    /// Adds a one-descriptor buffer (unpublished). Returns its id.
    #[inline(always)]
    pub fn add_one(&mut self, b: Buf) -> Result<u16> {
        dispatch!(self, q => q.add_one(b))
    }

    /// Adds up to `max` one-descriptor buffers in one run, the format chosen once for the
    /// run rather than per buffer: `buf(k, id)` gives the `k`-th buffer, which will carry id
    /// `id` (a driver with a buffer per id fills that one first); `None` ends the run.
    /// Returns how many were added (unpublished).
    #[inline]
    pub fn add_many(
        &mut self,
        max: usize,
        mut buf: impl FnMut(usize, u16) -> Option<Buf>,
    ) -> Result<usize> {
        match self {
            Self::Packed(q) => Ok(q.add_run(max, buf)),
            Self::Split(q) => {
                let mut n = 0;
                while n < max {
                    let Some(id) = q.next_free() else { break };
                    let Some(b) = buf(n, id) else { break };
                    q.add_one(b)?;
                    n += 1;
                }
                Ok(n)
            }
        }
    }

    /// Adds a chain of buffers (unpublished). Returns its id.
    #[inline]
    pub fn add_chain(&mut self, bufs: &[Buf]) -> Result<u16> {
        dispatch!(self, q => q.add_chain(bufs))
    }

    /// Makes the added buffers visible with one index store; true if the device must be kicked.
    #[inline(always)]
    pub fn publish(&mut self) -> bool {
        dispatch!(self, q => q.publish())
    }

    /// Starts a reclaim batch: loads the device's index once; returns used entries waiting.
    #[inline(always)]
    pub fn used_available(&mut self) -> Result<u16> {
        dispatch!(self, q => q.used_available())
    }

    /// The next used buffer of the batch: (id, bytes written), validated.
    #[inline(always)]
    pub fn pop_used(&mut self) -> Result<Option<(u16, u32)>> {
        dispatch!(self, q => q.pop_used())
    }

    /// Takes up to `max` used buffers into `out`, (id, bytes written) each, validated: the
    /// reclaim of a burst in one call. The packed ring first takes the run of descriptors that
    /// return one buffer each, reading each once (`packed::DriverQueue::pop_used_run`);
    /// the rest (and every split entry: its index is read once per batch anyway) are counted,
    /// then popped.
    #[inline]
    pub fn pop_used_batch(&mut self, out: &mut Vec<(u16, u32)>, max: usize) -> Result<usize> {
        let mut k = match self {
            Self::Packed(q) => q.pop_used_run(out, max)?,
            Self::Split(_) => 0,
        };
        if k < max {
            dispatch!(self, q => {
                q.used_available()?;
                while k < max {
                    let Some(e) = q.pop_used()? else { break };
                    out.push(e);
                    k += 1;
                }
            });
        }
        Ok(k)
    }

    /// Asks for no interrupts (a hint).
    #[inline]
    pub fn disable_used_notify(&mut self) {
        dispatch!(self, q => q.disable_used_notify())
    }

    /// Arm, fence, re-check for used buffers.
    #[inline]
    pub fn arm_used_notify(&mut self) -> Result<Armed> {
        dispatch!(self, q => q.arm_used_notify())
    }
}
