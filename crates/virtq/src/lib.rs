//! Virtqueue engine (virtio 1.x section 2), in both roles, behind two seams the rest of pvnet
//! builds on.
//!
//! * [`queue::DeviceQueue`] / [`queue::DriverQueue`]: one queue API over the ring formats
//!   (the split ring, [`split`], and the packed ring, [`packed`], each a layout module with
//!   `device.rs` and `driver.rs` beside it, over the vocabulary of [`config`]). The dataplane
//!   and the vhost-user glue name only these.
//!   - device side: pops batches of available descriptor chains, validating everything the
//!     driver wrote, writes used entries and publishes them with one release and one index
//!     store per batch, and makes one notification decision per batch;
//!   - driver side: adds buffers with one index store per batch and reclaims used buffers in
//!     batches, validating what the device wrote.
//! * [`xlate::Translate`]: the translation seam, from the peer's addresses to host memory with
//!   a permission; [`mem::MemTable`] is the translator: the validated region table, or an
//!   IOTLB snapshot of what the peer granted ([`MemTable::granted`], from an [`Iotlb`]). A
//!   miss is a value: fatal for the table, retryable for grants.
//! * [`chain::Chain`]: a parsed chain, format-neutral; [`mem::Seg`] its pieces, each borrowing
//!   the memory it points into.
//!
//! Contract: nothing in this crate panics on input read from shared memory. A rule broken by
//! the peer is returned as an [`Error`]; the owner stops the queue and reports it.
//! No syscalls, no threads, no allocation after a queue is built.

pub mod chain;
pub mod config;
pub mod dirty;
pub mod error;
pub mod event;
pub mod iotlb;
pub mod mem;
pub mod packed;
pub mod queue;
mod ring;
pub mod split;
pub mod trace;
pub mod xlate;

#[cfg(any(test, feature = "mock"))]
pub mod mock;

pub use chain::Chain;
pub use config::Format;
pub use dirty::DirtyLog;
pub use error::Error;
pub use iotlb::{Iotlb, IotlbError};
pub use mem::{Grant, MemTable, RegionSpec, Seg};
pub use queue::{DeviceQueue, DriverQueue};
pub use xlate::{Miss, Perm, Translate};
