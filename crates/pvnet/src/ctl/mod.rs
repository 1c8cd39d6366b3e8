//! The control channel of `pvnet switch` and its client, `pvnet ctl`; Prometheus metrics.
//!
//! The switch hands [`serve_ctl`] (and optionally [`serve_metrics`]) a closure that produces
//! its current [`Status`], and [`serve_ctl`] one that applies changes ([`Op`]); each server
//! runs on one thread of its own and never touches the dataplane itself.
//!
//! Protocol on the control socket (a Unix stream socket; docs/operations.md): the client
//! sends one request line and the server answers with one line of JSON and closes.
//! - Version 1, a JSON object: `{"version":1,"op":"port-add","spec":"KIND:key=value,..."}`,
//!   `{"version":1,"op":"port-del","name":"vm1"}`,
//!   `{"version":1,"op":"port-set","name":"vm1","set":{"qdisc":"fifo"}}`,
//!   `{"version":1,"op":"reload"}`, `{"version":1,"op":"status"}`; answered by a [`Reply`]:
//!   `{"version":1,"ok":true,"result":"added",...}` or `{"version":1,"ok":false,"error":...}`.
//! - The bare words `status`, `ports` and `macs` (the first protocol, kept): the whole
//!   [`Status`], or `{"error":"..."}`.
//!
//! Only the switch's own user (and root, and the members of the group the switch was given)
//! may talk to it: the socket is created 0600 (0660 with a group) and each connection's peer
//! credentials (`SO_PEERCRED`) are checked.

mod client;
mod cmd;
mod conn;
mod http;
mod metrics;
mod protocol;
mod server;
mod table;
#[cfg(test)]
mod test_util;

pub use client::{change, request};
pub use cmd::{run, CtlArgs};
pub use http::serve_metrics;
pub use protocol::{ApplyFn, MacInfo, Op, PortInfo, Reply, Status, StatusFn, WorkerRow};
pub use server::{serve_ctl, Server};

/// Where `pvnet switch` listens for control requests unless told otherwise.
pub const DEFAULT_CTL_SOCKET: &str = "/run/pvnet/ctl.sock";
