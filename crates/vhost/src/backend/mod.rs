//! Backend side: one control session per frontend connection.
//!
//! The session answers vhost-user messages on its own thread and owns the vring *configuration*
//! (sizes, addresses, fds, the memory table). When a ring becomes runnable (kick fd received
//! and, with `VHOST_USER_F_PROTOCOL_FEATURES`, enabled) it builds a validated
//! [`DeviceQueue`] and hands it to the dataplane through [`DeviceHooks::start_queue`]; from then
//! on the dataplane thread alone touches the ring. `GET_VRING_BASE` and disable take the ring
//! back synchronously ([`DeviceHooks::stop_queue`]) and report where it stopped.
//!
//! A frontend that disconnects or dies only ends its own session: its queues are stopped, its
//! port is removed and its memory unmapped once the dataplane lets go of the table.
//!
//! With `VIRTIO_F_ACCESS_PLATFORM` the session also keeps the IOTLB: the master copy of what
//! the frontend granted ([`virtq::Iotlb`]), changed by `VHOST_USER_IOTLB_MSG`, and handed to
//! the queues as an immutable snapshot ([`MemTable::granted`]) after every change, the same
//! way a new memory table is. The queues ask for what they miss on the backend channel
//! ([`BackendChannel`]).
//!
//! One concern per file:
//! * `session`: the per-connection state machine (features, memory table, IOTLB, vring set-up,
//!   starting and stopping rings);
//! * `requests`: the requests the rust-vmm `vhost` crate dispatches, answered on that state;
//! * `run`: one session's thread: the loop that takes the messages the crate does not
//!   dispatch and hands the rest to the crate;
//! * `wire`: the one decoder of the messages the crate does not dispatch (header, body size
//!   before the body is read, fds, body), and the acks to them;
//! * `listen`: listening and connecting, one thread per session, the session limit.

mod listen;
mod requests;
mod run;
mod session;
#[cfg(test)]
mod tests;
mod wire;

pub use listen::{connect_loop, serve, serve_port, Listener};
pub use run::run_session;
pub use session::{Session, SessionError, MIN_MTU};

use crate::eventfd::Notifier;
use crate::features::{DEVICE_FEATURES, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MTU};
use crate::iotlb::BackendChannel;
use std::sync::{Arc, Mutex};
use virtq::DeviceQueue;
use virtq::MemTable;

/// Identifies a frontend connection (a switch port) for the life of the backend process.
pub type PortId = u32;

/// A queue ready to run, handed to the dataplane.
#[derive(Debug)]
pub struct StartedQueue {
    /// vhost-user queue index (even: receive, odd: transmit: [`pvnet_net::QueueIndex`]).
    pub index: u16,
    /// The validated ring.
    pub queue: DeviceQueue,
    /// Kick eventfd; `None` when the frontend polls (`VHOST_USER_VRING_NOFD_MASK`).
    pub kick: Option<Notifier>,
    /// Call eventfd; `None` when the frontend polls.
    pub call: Option<Notifier>,
    /// Error eventfd, signalled when the queue is stopped for a violation.
    pub err: Option<Notifier>,
    /// `VIRTIO_NET_F_MRG_RXBUF` negotiated: a received packet may span several chains.
    pub mergeable: bool,
    /// Every feature the frontend acked (offloads decide what it may be sent).
    pub features: u64,
    /// With `VIRTIO_F_ACCESS_PLATFORM`: where to ask for a translation the queue misses.
    pub iotlb: Option<Arc<BackendChannel>>,
    /// The MTU the frontend set (`NET_SET_MTU`), else the port's configured one: the largest
    /// IP packet it takes, so frames above it plus the Ethernet header are not sent to it.
    pub mtu: Option<u16>,
}

/// What the dataplane provides to the control plane. Called from session threads.
pub trait DeviceHooks: Send + Sync + 'static {
    /// A frontend connected and was given `port`.
    fn port_connected(&self, port: PortId);
    /// A queue is runnable: the dataplane takes ownership.
    fn start_queue(&self, port: PortId, q: StartedQueue);
    /// Stops a running queue and returns its next avail index (None if it was not running).
    /// Must not return before the dataplane has let go of the ring.
    fn stop_queue(&self, port: PortId, index: u16) -> Option<u16>;
    /// The memory table (or the IOTLB snapshot) changed while queues may be running. With
    /// `wait`, must not return before every running queue of the port has switched to `mem`:
    /// after an IOTLB invalidation (or a new table) the frontend is told (acked) only then,
    /// and may reuse the range. A grant added needs no wait: a queue that looks before it
    /// switches finds a retryable miss and tries again after it has.
    fn set_mem(&self, port: PortId, mem: Arc<MemTable>, wait: bool);
    /// The frontend is gone: every queue of the port is already stopped.
    fn port_gone(&self, port: PortId);
    /// The guest with address `mac` is behind `port` now (`SEND_RARP`, after a migration).
    fn announce(&self, _port: PortId, _mac: [u8; 6]) {}
}

/// A port's offer as its listener or connector holds it: each new session reads it when the
/// frontend connects, so a change (`pvnet ctl port set ... offloads=false`) applies from the
/// frontend's next connection (features are negotiated once per connection).
pub type SharedConfig = Arc<Mutex<BackendConfig>>;

/// Backend configuration shared by every session.
#[derive(Debug, Clone, Copy)]
pub struct BackendConfig {
    /// Queue pairs offered (`GET_QUEUE_NUM`).
    pub queue_pairs: u16,
    /// Largest queue size accepted.
    pub max_queue_size: u16,
    /// Memory slots offered (`GET_MAX_MEM_SLOTS`).
    pub mem_slots: u64,
    /// virtio features offered (`GET_FEATURES`).
    pub features: u64,
    /// The port's MTU, if configured: `VIRTIO_NET_F_MTU` is offered, and a frontend's
    /// `NET_SET_MTU` above it is refused. Without it the frontend's MTU is taken as it comes.
    pub mtu: Option<u16>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            queue_pairs: 1,
            max_queue_size: 32768,
            mem_slots: 32,
            features: DEVICE_FEATURES,
            mtu: None,
        }
    }
}

impl BackendConfig {
    /// What `GET_FEATURES` answers: `features`, `VIRTIO_NET_F_MQ` when more than one pair is
    /// offered (QEMU passes MQ to the guest only if the backend has it; DPDK's virtio-user
    /// sets up more than one pair only then), and `VIRTIO_NET_F_MTU` when an MTU is
    /// configured (not otherwise: a frontend that takes the bit reads an MTU from its config
    /// space, which over vhost-user only it can fill).
    pub(crate) fn offered(&self) -> u64 {
        let mut f = self.features;
        if self.queue_pairs > 1 {
            f |= VIRTIO_NET_F_MQ;
        }
        if self.mtu.is_some() {
            f |= VIRTIO_NET_F_MTU;
        }
        f
    }
}

/// Grants one frontend may hold at once (IOTLB entries). A Linux guest in strict mode has one
/// per buffer in flight (a few thousand at most); a pool, a handful.
pub const MAX_GRANTS: usize = 8192;

/// Sessions one listener runs at once (each is a thread): a switch port takes one frontend,
/// `pvnet backend` without `--sessions` at most this many; more are refused.
pub const MAX_SESSIONS: usize = 64;
