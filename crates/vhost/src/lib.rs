//! vhost-user glue: everything between a Unix socket and a running [`virtq`] queue.
//!
//! * [`backend`]: one control session per connected frontend. It answers the vhost-user
//!   messages (through the rust-vmm `vhost` crate), maps the frontend's memory, and hands
//!   started queues to the dataplane through [`backend::DeviceHooks`]. The session never
//!   touches a running ring: the dataplane owns it.
//! * [`frontend`]: pvnet's own virtio-net driver over vhost-user: memfd memory, eventfds,
//!   negotiation, and a burst send / burst receive API.
//! * [`features`]: the feature bits the device and the driver use.
//! * `iotlb`: the vhost-user IOTLB messages and the backend request channel (handled on
//!   the crate's framing: the crate dispatches neither).
//! * `mmap`: shared mappings of the peer's fds, owned by the memory table; `fault`: the
//!   SIGBUS guard over them.
//! * `eventfd`: kick/call/err notifiers with counters.
//! * `ratelimit`: a bound on the log lines a peer can cause.
//! * `rxpool`: the frontend's receive buffers, carved from chunks and sized by an EWMA.
//!
//! The modules are private but [`backend`], [`frontend`] and [`features`]; what the other
//! crates name from the rest is re-exported here.

pub mod backend;
mod eventfd;
mod fault;
pub mod features;
pub mod frontend;
mod iotlb;
mod mmap;
mod ratelimit;
mod rxpool;

pub use eventfd::{Notifier, Stop};
pub use fault::generation as fault_generation;
pub use iotlb::BackendChannel;
pub use mmap::{table_faulted, table_views, Mapping, View};
pub use ratelimit::PeerLog;
