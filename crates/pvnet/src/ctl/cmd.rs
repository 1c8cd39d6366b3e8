//! `pvnet ctl`: asks a running switch and prints a table, or its JSON.

use super::client::{change, request};
use super::protocol::{Op, Reply};
use super::table::{render_macs, render_ports};
use super::DEFAULT_CTL_SOCKET;
use crate::error::Result;
use clap::Args;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;

/// What `pvnet ctl` does.
#[derive(Debug, Clone, clap::Subcommand, PartialEq, Eq)]
pub enum CtlCmd {
    /// Ports: kind, state, packet/byte/drop/notification counters (the default).
    Ports,
    /// The learned MAC address table.
    Macs,
    /// Add, delete or change a port while the switch runs.
    #[command(subcommand)]
    Port(PortCmd),
    /// Read the switch's configuration file again and apply the difference (as SIGHUP).
    Reload,
}

/// `pvnet ctl port ...`.
#[derive(Debug, Clone, clap::Subcommand, PartialEq, Eq)]
pub enum PortCmd {
    /// Add a port: KIND:key=value,... as `pvnet switch --port` (see `pvnet switch --help`).
    /// Adding a port identical to one there succeeds ("exists"); a different port of that
    /// name is refused.
    Add {
        /// The port spec, e.g. vhost-user:name=vm1,socket=/run/vm1.sock
        spec: String,
    },
    /// Delete a port: its frontend is disconnected, what waited for it counted as dropped;
    /// prints its last counters. A port that is not there: "absent", not an error.
    Del {
        /// Port name.
        name: String,
    },
    /// Change a port's settings: any port's VLANs (vlan, trunk, native) and a vhost-user
    /// port's egress (qdisc, dql, bulk, limit) at once; offloads and queue_pairs from its
    /// frontend's next connection. `key=` puts a key back to its default.
    Set {
        /// Port name.
        name: String,
        /// key=value, one or more.
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Move a vhost-user port to another worker (`pvnet switch --workers N`): its rings,
    /// egress queue, counters and learned addresses go along, the other workers paused for
    /// the move (about 0.1 ms here); no packet is lost or reordered by it. The balancer
    /// may move it again later unless `--rebalance false`.
    Move {
        /// Port name.
        name: String,
        /// The worker's index (as `pvnet ctl` lists them).
        worker: usize,
    },
}

/// `pvnet ctl` arguments.
#[derive(Args, Debug, Clone)]
#[command(after_help = "\
EXAMPLES:
  pvnet ctl                                  ports and their counters
  pvnet ctl port add vhost-user:name=vm2,socket=/run/pvnet/vm2.sock
  pvnet ctl port set vm2 qdisc=fifo limit=256
  pvnet ctl port set vm2 vlan= trunk=10,20-29 native=1   (key=: back to its default)
  pvnet ctl port del vm2
  pvnet ctl port move vm2 1                  put vm2 on worker 1
  pvnet ctl reload                           apply the edited --config file

The protocol (one JSON line each way, versioned) is in docs/operations.md.")]
pub struct CtlArgs {
    /// The switch's control socket (`pvnet switch --ctl-socket`).
    #[arg(long, default_value = DEFAULT_CTL_SOCKET, global = true)]
    pub ctl_socket: PathBuf,
    /// Print JSON instead of a table: the switch's whole status (every counter, the MAC
    /// table, uptime), or the reply to a change.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do (default: ports).
    #[command(subcommand)]
    pub cmd: Option<CtlCmd>,
}

/// `key=value` settings as a map.
fn settings(kv: &[String]) -> Result<BTreeMap<String, String>> {
    kv.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| crate::error::usage(format!("'{s}' is not key=value")))
        })
        .collect()
}

/// A change's reply as a person reads it.
fn render_reply(r: &Reply) -> String {
    let mut o = r.result.clone().unwrap_or_default();
    if let Some(p) = &r.port {
        let _ = write!(o, ": {} ({})", p.name, p.kind);
    }
    o.push('\n');
    for n in &r.notes {
        let _ = writeln!(o, "  {n}");
    }
    if let Some(p) = r
        .port
        .as_ref()
        .filter(|_| r.result.as_deref() == Some("deleted"))
    {
        let c: Vec<String> = p
            .counters
            .iter()
            .filter(|(_, &v)| v != 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(o, "  last counters: {}", c.join(" "));
    }
    o
}

/// Runs `pvnet ctl`: asks the switch and prints a table or the JSON.
pub fn run(a: &CtlArgs) -> Result<()> {
    let cmd = a.cmd.clone().unwrap_or(CtlCmd::Ports);
    let op = match &cmd {
        CtlCmd::Ports | CtlCmd::Macs => None,
        CtlCmd::Reload => Some(Op::Reload),
        CtlCmd::Port(PortCmd::Add { spec }) => Some(Op::PortAdd { spec: spec.clone() }),
        CtlCmd::Port(PortCmd::Del { name }) => Some(Op::PortDel { name: name.clone() }),
        CtlCmd::Port(PortCmd::Set { name, settings: kv }) => Some(Op::PortSet {
            name: name.clone(),
            set: settings(kv)?,
        }),
        CtlCmd::Port(PortCmd::Move { name, worker }) => Some(Op::PortMove {
            name: name.clone(),
            worker: *worker,
        }),
    };
    let out = match op {
        Some(op) => {
            let r = change(&a.ctl_socket, op)?;
            if a.json {
                serde_json::to_string(&r)? + "\n"
            } else {
                render_reply(&r)
            }
        }
        None => {
            let s = request(
                &a.ctl_socket,
                if cmd == CtlCmd::Macs { "macs" } else { "ports" },
            )?;
            if a.json {
                serde_json::to_string(&s)? + "\n"
            } else if cmd == CtlCmd::Macs {
                render_macs(&s)
            } else {
                render_ports(&s)
            }
        }
    };
    match io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(crate::error::io("stdout")(e)),
        _ => Ok(()),
    }
}
