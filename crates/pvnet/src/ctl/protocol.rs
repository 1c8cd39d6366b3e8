//! The control protocol's messages: the switch's [`Status`] and the versioned [`Request`] /
//! [`Reply`] pair (docs/operations.md), and the closures a server is handed.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The switch's state as `pvnet ctl` and the metrics endpoint see it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct Status {
    /// Seconds since the switch started.
    pub uptime_secs: f64,
    /// Every port, in the switch's order.
    pub ports: Vec<PortInfo>,
    /// The learned MAC address table.
    pub macs: Vec<MacInfo>,
    /// The dataplane's worker threads.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerRow>,
}

/// One dataplane worker thread.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct WorkerRow {
    /// Its index.
    pub worker: usize,
    /// The CPU it is pinned to, if it is.
    pub cpu: Option<usize>,
    /// Its CPU time since the switch started (user + system), seconds.
    pub cpu_secs: f64,
    /// That time as a share of the switch's uptime, percent (a worker that polls all the
    /// time is at 100).
    pub busy_pct: f64,
    /// The ports placed on it.
    pub ports: Vec<String>,
    /// Packets it handed to other workers, and that they handed to it.
    pub handoff_out: u64,
    /// See `handoff_out`.
    pub handoff_in: u64,
    /// Share of the last second it spent in rounds that moved packets, percent (what
    /// placement and rebalancing go by: polling empty rings is not load).
    pub load_pct: f64,
    /// Time it spent in rounds that moved packets since the switch started, seconds.
    pub busy_secs: f64,
    /// Ports moved onto it, and off it.
    pub moved_in: u64,
    /// See `moved_in`.
    pub moved_out: u64,
}

/// One switch port.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct PortInfo {
    /// Port name, unique within the switch.
    pub name: String,
    /// `vhost-user`, `tap`, `sink`, `gen`, ...
    pub kind: String,
    /// `up`, `down`, `listening`, ...
    pub state: String,
    /// Socket path, interface name, ...
    pub detail: String,
    /// Flat counter map (`rx_packets`, `tx_bytes`, `drops_no_buffer`, ...); rendered
    /// generically, so a new counter needs no change here.
    pub counters: BTreeMap<String, u64>,
    /// Why a queue of the port was last stopped (the rule its peer broke), if one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Each queue pair's counters (`rx_packets`, `tx_packets`, `drops`, ...), when the port
    /// has more than one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<BTreeMap<String, u64>>,
}

/// One learned MAC address.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct MacInfo {
    /// Its VLAN (0: ports with no VLAN settings).
    pub vlan: u16,
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// Name of the port it was learned on.
    pub port: String,
    /// Seconds since a frame from it was last seen.
    pub age_secs: f64,
}

/// Produces the switch's current status; called on the server thread once per request.
pub type StatusFn = Arc<dyn Fn() -> Status + Send + Sync>;

/// The control protocol's version (the `version` of requests and replies).
pub const PROTOCOL_VERSION: u32 = 1;

/// A request of the JSON protocol.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Request {
    /// Protocol version the client speaks; the server refuses a newer one.
    pub version: u32,
    /// What to do.
    #[serde(flatten)]
    pub op: Op,
}

/// What a request asks for.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Op {
    /// The whole status (as the bare word `status`).
    Status,
    /// Add a port, `KIND:key=value,...` as `pvnet switch --port`. Idempotent: an identical
    /// port of that name is `exists`; a different one is an error.
    PortAdd {
        /// The port spec.
        spec: String,
    },
    /// Delete a port: its frontend is disconnected, what was in flight counted. Deleting a
    /// port that is not there is `absent`, not an error.
    PortDel {
        /// Port name.
        name: String,
    },
    /// Change settings of a port (`key=value` as in its spec).
    PortSet {
        /// Port name.
        name: String,
        /// Keys and values.
        set: BTreeMap<String, String>,
    },
    /// Move a vhost-user port to another worker (with its rings, queue and counters).
    PortMove {
        /// Port name.
        name: String,
        /// The worker's index.
        worker: usize,
    },
    /// Read the configuration file again and apply the difference (as `SIGHUP`).
    Reload,
}

/// The answer to a [`Request`].
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct Reply {
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Whether the request was carried out.
    pub ok: bool,
    /// What happened: `added`, `exists`, `deleted`, `absent`, `changed`, `unchanged`,
    /// `reloaded`, `status`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why not (with `ok: false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Details: what changed, what applies when.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The port concerned (a deleted port: its last counters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortInfo>,
    /// The status (`op: status`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl Reply {
    /// A successful reply.
    pub fn done(result: &str) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            ok: true,
            result: Some(result.into()),
            ..Self::default()
        }
    }
    /// A refusal.
    pub fn refused(error: impl Into<String>) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            ok: false,
            error: Some(error.into()),
            ..Self::default()
        }
    }
}

/// Applies a change; called on the control thread, one request at a time.
pub type ApplyFn = Arc<dyn Fn(&Op) -> Reply + Send + Sync>;
