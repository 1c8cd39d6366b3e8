//! The dataplane: shards (threads) own ports and run the poll loop over them; the switch
//! moves packets between ports; the control plane only hands it queues.
//!
//! * `pkt`: the vocabulary every layer shares: a packet (`Pkt`), what became of one offered
//!   to a port, what a port takes, a port's id, the burst sizes.
//! * `flow`: the flow hash (egress queue classification, receive-ring steering).
//! * `port`: everything packets enter and leave through, behind one `Port` interface
//!   (vhost-user, tap, AF_PACKET, AF_XDP, VXLAN, sink, gen, the trunk between shards).
//! * `switch`: one ingress loop over every port; learned or fixed routes; offload fitting.
//! * `egress`: where backpressure is decided: packets wait in their senders or in a
//!   per-port queue (fifo or fq_codel, drained in bulk under a dynamic queue limit).
//! * `worker`: the shards, placement, and the handle the control plane drives them with
//!   ([`Dataplane`]).
//! * `poll`: policies, the adaptive window, the clock, and the poll loop's pure decisions.
//! * `stats`: counters per (port, queue pair), one writer each, summed for display.
//! * `sys`: the operating system (epoll, timerfd, eventfd, pinning, the tap device,
//!   `AF_PACKET`, `io_uring`, the XDP program and the AF_XDP sockets, batched UDP).
//! * [`frame`]: the benchmark frame format (sequence numbers and the end marker).
//!
//! The modules are private but [`frame`] (a format other programs speak) and `testing`; what
//! the other crates name is re-exported here.
//!
//! Module dependencies run one way, each naming only modules before it (at the bottom, in
//! any order: `sys`, `stats`, `frame`, `flow`; then `pkt`, `poll`):
//! `pkt`, `poll` <- `egress` <- `port` <- `switch` <- `worker` (`scripts/check_imports.py`
//! fails on a circle).

mod egress;
mod flow;
pub mod frame;
mod mac;
mod pkt;
mod poll;
mod port;
mod stats;
mod switch;
mod sys;
mod worker;

/// Mock frontends behind real ports: the tests' and the in-process experiments' harness.
#[cfg(any(test, feature = "testing"))]
pub mod testing;

// What the other crates name (the CLI, the examples); the modules themselves are private.
pub use egress::pace::TARGET as DQL_TARGET;
pub use egress::queue::{ParseQdiscError, Qdisc, QueueConfig};
pub use egress::{EgressConfig, HoldPolicy, HOLD};
pub use mac::MacTable;
pub use pkt::Pkt;
pub use poll::{Idle, ParsePolicyError, Policy, Poller, WakeCost};
pub use port::gen::{GenPort, GenSpec};
pub use port::kernel::{HostDev, HostIo, KernelPort, ParseHostIoError};
pub use port::sink::{Counting, SinkPort};
pub use port::trunk::{link as trunk_link, Consumer, Producer, TrunkPort, TRUNK_RING_BYTES};
pub use port::vhost::{VhostConfig, VhostPort, MAX_STEER};
pub use port::vxlan::{Underlay as VxlanUnderlay, VxlanConfig, VxlanPort};
pub use port::AnyPort;
pub use stats::{DropReason, PortSnapshot, PortStats, QueueSnapshot};
pub use switch::vlan::{VlanError, VlanMode, VlanSet, VLAN_MAX};
pub use switch::{Fabric, MacEntry, Router, SwitchConfig, Wire};
pub use sys::{packet, pin_current_thread, tap, udp, xdp};
pub use worker::balance::RebalanceConfig;
pub use worker::{Dataplane, GenConfig, HostPort, MoveError, Role, WorkerConfig, WorkerInfo};

/// The VXLAN port's settings and limits, for the command line.
pub mod vxlan {
    pub use crate::port::vxlan::{
        Underlay, VxlanConfig, VxlanPort, DEFAULT_PORT, MAX_REMOTES, MAX_SRCPORTS, OVERHEAD,
    };
}
