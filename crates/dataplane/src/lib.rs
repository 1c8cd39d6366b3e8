//! The dataplane: one worker thread owns every running ring, polls them in batches and moves
//! packets between ports; the control plane only hands it queues.
//!
//! * [`worker`]: the thread, its command channel, epoll, and the poll loop
//!   (process a batch; poll on while work keeps coming; when the window passes with no work,
//!   arm, fence, re-check, and only then sleep).
//! * [`port`]: a vhost-user port's queues and what the port does with packets (sink, generator,
//!   forward to its peer with exactly one copy).
//! * [`poll`]: the clock and the polling window (time injected for tests).
//! * [`stats`]: per-port counters, drops by reason.
//! * [`frame`]: the benchmark frame format (sequence numbers and the end marker).

pub mod frame;
pub mod poll;
pub mod port;
pub mod stats;
pub mod switch;
pub mod tap;
pub mod worker;
