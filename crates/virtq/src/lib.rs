//! Virtqueue engine (virtio 1.x section 2), in both roles, behind two seams the rest of pvnet
//! builds on.
//!
//! * [`DeviceQueue`] / [`DriverQueue`]: one queue API over the ring formats
//!   (the split ring, [`split`], and the packed ring, [`packed`], each a layout module with
//!   `device.rs` and `driver.rs` beside it, over the vocabulary of `config`: [`Format`], [`QueueConfig`] and the rest). The dataplane
//!   and the vhost-user glue name only these.
//!   - device side: pops batches of available descriptor chains, validating everything the
//!     driver wrote, writes used entries and publishes them with one release and one index
//!     store per batch, and makes one notification decision per batch;
//!   - driver side: adds buffers with one index store per batch and reclaims used buffers in
//!     batches, validating what the device wrote.
//! * [`Translate`]: the translation seam, from the peer's addresses to host memory with
//!   a permission; [`MemTable`] is the translator: the validated region table, or an
//!   IOTLB snapshot of what the peer granted ([`MemTable::granted`], from an [`Iotlb`]). A
//!   miss is a value: fatal for the table, retryable for grants.
//! * [`Chain`]: a parsed chain, format-neutral; [`Seg`] its pieces, each borrowing
//!   the memory it points into.
//!
//! Contract: nothing in this crate panics on input read from shared memory. A rule broken by
//! the peer is returned as an [`Error`]; the owner stops the queue and reports it.
//! No syscalls, no threads, no allocation after a queue is built.
//!
//! The modules are private but the two formats' layouts ([`split`], [`packed`]) and the
//! harnesses ([`trace`], and `mock` with its feature); what the other crates name is
//! re-exported here.

mod chain;
mod config;
mod dirty;
mod error;
mod event;
mod iotlb;
mod mem;
pub mod packed;
mod queue;
mod ring;
pub mod split;
pub mod trace;
mod xlate;

#[cfg(any(test, feature = "mock"))]
pub mod mock;

pub use chain::Chain;
pub use config::{AddrSpace, Buf, Direction, Format, Perm, QueueConfig, RingAddrs, MAX_QUEUE_SIZE};
pub use dirty::{DirtyLog, LOG_PAGE};
pub use error::{Error, Result};
pub use event::{need_event, Armed};
pub use iotlb::{Iotlb, IotlbError};
pub use mem::{
    copy_segs, prefetch_range, read_segs, spare_peers, write_segs, Grant, MemTable, Prefetch,
    RegionSpec, Seg,
};
pub use queue::{DeviceQueue, DriverQueue, FormatQueue};
pub use xlate::{Miss, Translate, Window};
