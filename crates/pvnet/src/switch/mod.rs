//! `pvnet switch`: the daemon. Ports from a TOML file and/or `--port` flags: vhost-user
//! (server socket or client with reconnect), tap (the host kernel, offloads on), AF_PACKET,
//! sink and gen; an L2 learning switch between them (`pvnet_dataplane::switch`); `pvnet ctl` on
//! a control socket, Prometheus metrics on an optional address; final counters as JSON on
//! stdout.
//!
//! [`config`] is the file and `--port` model and its checks, [`runtime`] the live port set the
//! control plane changes, [`cmd`] the command: flags, loading, the main loop. They depend one
//! way: `cmd` -> `runtime` -> `config`.

mod cmd;
mod config;
mod runtime;

pub use cmd::{run, SwitchArgs};
