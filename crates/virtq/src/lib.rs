//! Split virtqueue engine (virtio 1.x, section 2.7), in both roles.
//!
//! * [`split::DeviceQueue`]: the device side. Pops batches of available descriptor chains,
//!   validating everything the driver wrote, writes used entries and publishes them with one
//!   release and one `used->idx` store per batch, and makes one notification decision per batch.
//! * [`split::DriverQueue`]: the driver side. Adds buffers with one `avail->idx` store per batch
//!   and reclaims used buffers in batches, validating what the device wrote (`used.id`,
//!   `used.len`).
//! * [`mem::MemTable`]: the validated region table; every access to shared memory goes through
//!   the pointers and lengths it hands out.
//!
//! Contract: nothing in this crate panics on input read from shared memory. A rule broken by
//! the peer is returned as an [`Error`]; the owner stops the queue and reports it.
//! No syscalls, no threads, no allocation after a queue is built.

pub mod error;
pub mod event;
pub mod mem;
pub mod split;

#[cfg(any(test, feature = "mock"))]
pub mod mock;

pub use error::Error;
pub use mem::{MemTable, RegionSpec, Seg};
