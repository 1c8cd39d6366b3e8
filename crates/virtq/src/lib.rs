//! Virtqueue engine (virtio 1.x section 2), in both roles, behind two seams the rest of pvnet
//! builds on.
//!
//! * [`queue::DeviceQueue`] / [`queue::DriverQueue`]: one queue API over the ring formats
//!   (today the split ring, [`split`]; the packed ring plugs in beside it). The dataplane and
//!   the vhost-user glue name only these.
//!   - device side: pops batches of available descriptor chains, validating everything the
//!     driver wrote, writes used entries and publishes them with one release and one index
//!     store per batch, and makes one notification decision per batch;
//!   - driver side: adds buffers with one index store per batch and reclaims used buffers in
//!     batches, validating what the device wrote.
//! * [`xlate::Translate`]: the translation seam, from the peer's addresses to host memory with
//!   a permission; [`mem::MemTable`] (the validated region table) is today's translator. A
//!   miss is a value: fatal for the table, retryable for a cache of grants.
//! * [`chain::Chain`]: a parsed chain, format-neutral; [`mem::Seg`] its pieces, each borrowing
//!   the memory it points into.
//!
//! Contract: nothing in this crate panics on input read from shared memory. A rule broken by
//! the peer is returned as an [`Error`]; the owner stops the queue and reports it.
//! No syscalls, no threads, no allocation after a queue is built.

pub mod chain;
pub mod error;
pub mod event;
pub mod mem;
pub mod packed;
pub mod queue;
mod ring;
pub mod split;
pub mod xlate;

#[cfg(any(test, feature = "mock"))]
pub mod mock;

pub use chain::Chain;
pub use error::Error;
pub use mem::{MemTable, RegionSpec, Seg};
pub use queue::{DeviceQueue, DriverQueue, Format};
pub use xlate::{Miss, Perm, Translate};
