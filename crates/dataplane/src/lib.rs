//! The dataplane: shards (threads) own ports and run the poll loop over them; the switch
//! moves packets between ports; the control plane only hands it queues.
//!
//! * [`pkt`]: the vocabulary every layer shares: a packet ([`pkt::Pkt`]), what became of one
//!   offered to a port, what a port takes, a port's id, the burst sizes.
//! * [`flow`]: the flow hash (egress queue classification, receive-ring steering).
//! * [`port`]: everything packets enter and leave through, behind one `Port` interface
//!   (vhost-user, tap, sink, gen).
//! * [`switch`]: one ingress loop over every port; learned or fixed routes; offload fitting.
//! * [`egress`]: where backpressure is decided: packets wait in their senders or in a
//!   per-port queue (fifo or fq_codel, drained in bulk under a dynamic queue limit).
//! * [`worker`]: the shards, placement, and the handle the control plane drives them with.
//! * [`poll`]: policies, the adaptive window, the clock, and the poll loop's pure decisions.
//! * [`stats`]: counters per (port, queue pair), one writer each, summed for display.
//! * [`sys`]: the operating system (epoll, timerfd, eventfd, pinning, the tap device).
//! * [`frame`]: the benchmark frame format (sequence numbers and the end marker).
//!
//! Module dependencies run one way, each naming only modules before it (at the bottom, in
//! any order: `sys`, `stats`, `frame`, `flow`; then `pkt`, `poll`):
//! `pkt`, `poll` <- `egress` <- `port` <- `switch` <- `worker` (`scripts/check_imports.py`
//! fails on a circle).

pub mod egress;
pub mod flow;
pub mod frame;
pub mod pkt;
pub mod poll;
pub mod port;
pub mod stats;
pub mod switch;
pub mod sys;
pub mod worker;

/// Mock frontends behind real ports: the tests' and the in-process experiments' harness.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
