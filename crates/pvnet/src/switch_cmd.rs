//! `pvnet switch`: the daemon. Ports from a TOML file and/or `--port` flags: vhost-user
//! (server socket or client with reconnect), tap (the host kernel, offloads on), sink and gen;
//! an L2 learning switch between them (`pvnet_dataplane::switch`); `pvnet ctl` on a control
//! socket, Prometheus metrics on an optional address; final counters as JSON on stdout.

use crate::ctl;
use crate::error::{io, usage, Result};
use crate::proc;
use crate::switch_rt::{Origin, Runtime};
use clap::Args;
use pvnet_dataplane::EgressConfig;
use pvnet_dataplane::HostIo;
use pvnet_dataplane::Policy;
use pvnet_dataplane::SwitchConfig;
use pvnet_dataplane::MAX_STEER;
use pvnet_dataplane::{Dataplane, Role, WorkerConfig};
use pvnet_dataplane::{Qdisc, QueueConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

const AFTER_HELP: &str = "\
PORTS (--port KIND:key=value,... ; repeatable, or [[port]] tables in --config):
  vhost-user:name=vm1,socket=/tmp/vm1.sock[,client=true][,queue_pairs=1][,offloads=true]
      a virtio-net device for QEMU (-chardev socket,path=...) or DPDK net_virtio_user;
      client=true connects to a frontend that listens (QEMU server=on) and reconnects.
      queue_pairs=N (1 to 64) offers N pairs (VIRTIO_NET_F_MQ): every pair the frontend
      enables is serviced, and each flow sent to it goes to one receive ring, by its hash
      (QEMU: -netdev vhost-user,queues=N and virtio-net-pci,mq=on; DPDK: queues=N).
      [,qdisc=fq_codel|fifo|none][,dql=true][,bulk=true][,limit=1024]: packets that find
      the frontend's receive ring full wait in this port's egress queue (copied; the sender
      goes on): fq_codel (flow queues, CoDel: target 5 ms, interval 100 ms) or fifo, at most
      limit packets, drained in bulk each round (bulk=false: one packet per dequeue); dql
      bounds how many buffers of the ring pvnet fills ahead of the frontend (dynamic queue
      limits, learned from the buffers it gives back); qdisc=none: no queue, a packet waits
      in its sender up to 2 ms, then is dropped (no_buffer). Drops: queue_limit, aqm.
      [,policy=coalesce:500]: this port's transmit rings are polled by their own policy
      (--policy's values; default: the switch's --policy), e.g. coalesce for a bulk
      guest whose CPU matters more than a few hundred microseconds of latency.
  tap:name=host,ifname=pvtap0[,offloads=true][,mtu=1500][,io=uring][,direct=true][,persist=false]
      the host kernel, IFF_VNET_HDR: checksum and TSO pass through in both directions.
      io=uring: reads and writes go to the kernel in bursts, one io_uring submission each
      (falls back to syscall, logged, where io_uring is not available); io=syscall: one
      read or writev per packet. [,direct=true] (io=uring): when every packet from the
      kernel goes to one vhost-user frontend (it is the only other port that receives),
      the kernel reads them straight into its receive buffers: one copy, not two (counted
      as rx_direct); direct=false reads into the port's own buffers first.
      persist=true: the interface outlives pvnet (TUNSETPERSIST), with its addresses and
      routes, so that a restarted pvnet attaches to it again and the host sees no change
      (deleting the port with `pvnet ctl port del` removes it).
      [,qdisc=none|fq_codel|fifo][,bulk=true][,limit=1024][,sndbuf=BYTES]: an egress queue
      as for vhost-user (default none: a packet the kernel has no room for is dropped,
      no_buffer). The device queue beneath it is the kernel's send buffer for the port's
      writes (sndbuf bytes: TUNSETSNDBUF, as QEMU's sndbuf=): a write past it finds no room
      and waits in the queue. A tap's is unbounded unless set (the kernel takes every
      write), so a tap's queue needs sndbuf. With a queue, writes are one syscall each (the
      kernel's answer is needed before the sender lets go of the packet); no dql (the
      kernel reports no completions).
  af-packet:name=wire,ifname=veth0[,io=uring][,direct=true]
      an existing interface (a veth, a NIC) through an AF_PACKET socket with the same
      12-byte virtio-net header (Linux 6.5+), promiscuous; frames the host itself sends out
      of it are ignored. Offloads pass through as for the tap.
      [,qdisc=none|fq_codel|fifo][,bulk=true][,limit=1024][,sndbuf=BYTES]: as for the tap
      (sndbuf: SO_SNDBUF, default net.core.wmem_default; the kernel's queue fills when the
      interface's qdisc holds packets, e.g. under a rate limit).
  sink:name=s          consumes everything it is sent (reads every byte, checks bench frames)
  gen:name=g[,rate=PPS][,secs=S][,delay=S][,frame_len=64][,src=MAC][,dst=MAC][,flows=1]
      bench frames at PPS (0: as fast as receivers take them) for S seconds (0: forever),
      starting delay seconds after a receiver appears; then an end marker. flows=N (up to
      255) spreads them over N source addresses (the fifth byte xor 0..N, 32 frames in a
      row from each), so that a multiqueue port's flow hash puts them on all its rings.

RUNTIME (docs/operations.md):
  pvnet ctl port add|del|set ...   change ports while the switch runs (see pvnet ctl --help)
  SIGHUP, or pvnet ctl reload      read --config again and apply the difference
  --state FILE                     ports added with pvnet ctl come back after a restart

EXAMPLES:
  pvnet switch --port vhost-user:name=vm1,socket=/tmp/vm1.sock --port tap:name=host,ifname=pvtap0
  (to try it by hand without touching the machine's network, the tap in a namespace:
   ip netns add pv; ip netns exec pv pvnet switch --port ... --port tap:name=host,ifname=pvtap0
   ip -n pv addr add 10.0.0.1/24 dev pvtap0; ip netns exec pv ping 10.0.0.2; ip netns del pv)
  pvnet switch --config /etc/pvnet/switch.toml --state /var/lib/pvnet/ports.toml
  pvnet ctl ports            (counters of a running switch; --json for JSON)

TOML:
  [switch]
  cpu = 1
  workers = 1                          (worker threads; a new port goes to the least busy)
  rebalance = true                     (move a port off a worker saturated for 3 s)
  rebalance_load = 95                  (busy percent from which a worker is saturated)
  rebalance_spare = 1.0                (CPUs taken as idle; default: measured, /proc/stat)
  ctl_socket = \"/run/pvnet/ctl.sock\"
  ctl_group = \"pvnet\"                  (members may use pvnet ctl; default: owner only)
  state = \"/var/lib/pvnet/ports.toml\"
  metrics = \"127.0.0.1:9464\"
  [[port]]
  kind = \"vhost-user\"
  name = \"vm1\"
  socket = \"/tmp/vm1.sock\"";

/// `pvnet switch` arguments. Flags override the `[switch]` table of `--config`; `--port`
/// adds to its `[[port]]` list.
#[derive(Args, Debug, Clone, Default)]
#[command(after_help = AFTER_HELP)]
pub struct SwitchArgs {
    /// TOML file with a [switch] table and [[port]] tables.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A port: KIND:key=value,... (see PORTS below). Repeatable.
    #[arg(long = "port", value_name = "SPEC")]
    pub ports: Vec<String>,
    /// Pin the dataplane worker to this CPU (worker k to the k-th CPU after it).
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Dataplane worker threads. A new port goes to the least busy one (then the one with
    /// the fewest ports); a packet between ports of two workers crosses a ring between them
    /// (one more copy). Default 1.
    #[arg(long)]
    pub workers: Option<usize>,
    /// With several workers: move a vhost-user port off a worker that stays saturated (95%
    /// busy for 3 s) to the least busy one when that is predicted to relieve it, at most
    /// once per 10 s, and move it back if the switch then moves fewer packets. Placement of
    /// new ports by load happens either way; `pvnet ctl port move` moves by hand. Default
    /// true.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub rebalance: Option<bool>,
    /// The busy share, percent, from which a worker counts as saturated for rebalancing
    /// (time in rounds that moved packets; polling empty rings is not busy). Default 95.
    #[arg(long, value_name = "PCT")]
    pub rebalance_load: Option<f64>,
    /// CPUs the balancer takes as idle instead of measuring them (/proc/stat): a port moves
    /// only if its cost, and at least half a CPU, is idle. For a container whose /proc/stat
    /// is the host's. Default: measured.
    #[arg(long, value_name = "CPUS")]
    pub rebalance_spare: Option<f64>,
    /// Polling policy of transmit rings (see `pvnet backend --help`). Default adaptive.
    #[arg(long)]
    pub policy: Option<Policy>,
    /// Polling policy of receive rings waiting for buffers. Default adaptive.
    #[arg(long)]
    pub rx_policy: Option<Policy>,
    /// Most packets per source per round. Default 64.
    #[arg(long)]
    pub batch: Option<u16>,
    /// Microseconds a transmit-completion call may be held back (interrupt coalescing, see
    /// `pvnet backend --help`). Default 150.
    #[arg(long)]
    pub tx_call_delay: Option<u64>,
    /// Seconds a learned MAC address lives without traffic. Default 300.
    #[arg(long)]
    pub mac_aging: Option<u64>,
    /// Control socket for `pvnet ctl`. Default /run/pvnet/ctl.sock.
    #[arg(long)]
    pub ctl_socket: Option<PathBuf>,
    /// A group (name or number) whose members may use the control socket besides the
    /// switch's user (the socket is then 0660, else 0600).
    #[arg(long)]
    pub ctl_group: Option<String>,
    /// Keep the ports added with `pvnet ctl port add` in this file, so that they come back
    /// when the switch restarts (rewritten after each change; read at start).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464).
    #[arg(long)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Stop after this many seconds (0: run until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0.0)]
    pub duration: f64,
}

/// The `[switch]` table.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SwitchTable {
    cpu: Option<usize>,
    workers: Option<usize>,
    rebalance: Option<bool>,
    rebalance_load: Option<f64>,
    rebalance_spare: Option<f64>,
    policy: Option<String>,
    rx_policy: Option<String>,
    batch: Option<u16>,
    mac_aging: Option<u64>,
    tx_call_delay: Option<u64>,
    ctl_socket: Option<PathBuf>,
    ctl_group: Option<String>,
    state: Option<PathBuf>,
    metrics: Option<std::net::SocketAddr>,
}

/// One `[[port]]` table (or `--port` spec).
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum PortConfig {
    VhostUser {
        name: String,
        socket: PathBuf,
        #[serde(default)]
        client: bool,
        #[serde(default = "one")]
        queue_pairs: u16,
        #[serde(default = "yes")]
        offloads: bool,
        /// Egress queue scheduler: fq_codel, fifo, or none (packets wait in their senders).
        #[serde(default = "fq_codel")]
        qdisc: String,
        /// Bound the frontend's receive ring by a dynamic queue limit.
        #[serde(default = "yes")]
        dql: bool,
        /// Drain the egress queue in bulk (false: one packet per dequeue).
        #[serde(default = "yes")]
        bulk: bool,
        /// Most packets in the egress queue.
        #[serde(default = "qlimit")]
        limit: u32,
        /// Polling policy of this port's transmit rings (default: the switch's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<String>,
    },
    Tap {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ifname: Option<String>,
        #[serde(default = "yes")]
        offloads: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtu: Option<u32>,
        /// How packets move: uring (a burst per io_uring submission) or syscall (one each).
        #[serde(default = "uring")]
        io: String,
        /// Read straight into the receive buffers of the frontend packets go to (uring).
        #[serde(default = "yes")]
        direct: bool,
        /// The interface outlives pvnet (TUNSETPERSIST): its addresses survive a restart.
        #[serde(default)]
        persist: bool,
        /// Egress queue scheduler: none (a packet the kernel has no room for is dropped),
        /// fq_codel or fifo.
        #[serde(default = "no_qdisc")]
        qdisc: String,
        /// Drain the egress queue in bulk (false: one packet per dequeue).
        #[serde(default = "yes")]
        bulk: bool,
        /// Most packets in the egress queue.
        #[serde(default = "qlimit")]
        limit: u32,
        /// The kernel's send buffer for the port's writes, in bytes (default: the kernel's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sndbuf: Option<u32>,
    },
    AfPacket {
        name: String,
        ifname: String,
        /// How packets move: uring (a burst per io_uring submission) or syscall (one each).
        #[serde(default = "uring")]
        io: String,
        /// Read straight into the receive buffers of the frontend packets go to (uring).
        #[serde(default = "yes")]
        direct: bool,
        /// Egress queue scheduler: none (a packet the kernel has no room for is dropped),
        /// fq_codel or fifo.
        #[serde(default = "no_qdisc")]
        qdisc: String,
        /// Drain the egress queue in bulk (false: one packet per dequeue).
        #[serde(default = "yes")]
        bulk: bool,
        /// Most packets in the egress queue.
        #[serde(default = "qlimit")]
        limit: u32,
        /// The kernel's send buffer for the port's writes, in bytes (default: the kernel's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sndbuf: Option<u32>,
    },
    Sink {
        name: String,
    },
    Gen {
        name: String,
        #[serde(default)]
        rate: u64,
        #[serde(default)]
        secs: f64,
        #[serde(default)]
        delay: f64,
        #[serde(default = "frame_len")]
        frame_len: usize,
        #[serde(default = "gen_src")]
        src: String,
        #[serde(default = "gen_dst")]
        dst: String,
        #[serde(default = "one_flow")]
        flows: u8,
    },
}

fn one() -> u16 {
    1
}
/// A kernel port's `io` key.
pub(crate) fn host_io(port: &str, s: &str) -> Result<HostIo> {
    s.parse().map_err(|e| usage(format!("port {port}: {e}")))
}

pub(crate) fn io_name(io: HostIo, direct: bool) -> &'static str {
    match (io, direct) {
        (HostIo::Uring, true) => "io_uring, direct receive",
        (HostIo::Uring, false) => "io_uring",
        (HostIo::Syscall, _) => "a syscall per packet",
    }
}

fn uring() -> String {
    "uring".into()
}
fn fq_codel() -> String {
    "fq_codel".into()
}
fn no_qdisc() -> String {
    "none".into()
}
fn qlimit() -> u32 {
    1024
}

/// A vhost-user port's own transmit-ring policy (`policy=`), if it has one.
pub(crate) fn port_policy(p: &PortConfig) -> Result<Option<Policy>> {
    let PortConfig::VhostUser {
        name,
        policy: Some(s),
        ..
    } = p
    else {
        return Ok(None);
    };
    s.parse()
        .map(Some)
        .map_err(|e| usage(format!("port {name}: policy: {e}")))
}

/// A tap's or `AF_PACKET` port's egress settings from its `qdisc`, `bulk` and `limit` keys
/// (no `dql`: the kernel reports no completions), and its `sndbuf`; None for another kind.
pub(crate) fn kernel_egress(p: &PortConfig) -> Result<Option<(EgressConfig, Option<u32>)>> {
    let (PortConfig::Tap {
        name,
        qdisc,
        bulk,
        limit,
        sndbuf,
        ..
    }
    | PortConfig::AfPacket {
        name,
        qdisc,
        bulk,
        limit,
        sndbuf,
        ..
    }) = p
    else {
        return Ok(None);
    };
    Ok(Some((
        egress_of(name, qdisc, false, *bulk, *limit)?,
        *sndbuf,
    )))
}

/// A vhost-user port's egress settings from its `qdisc`, `dql`, `bulk` and `limit` keys.
pub(crate) fn egress_of(
    name: &str,
    qdisc: &str,
    dql: bool,
    bulk: bool,
    limit: u32,
) -> Result<EgressConfig> {
    let base = EgressConfig::switch_default();
    if limit == 0 || limit > 1 << 20 {
        return Err(usage(format!(
            "port {name}: limit must be 1..={} packets",
            1 << 20
        )));
    }
    let queue = match qdisc {
        "none" => None,
        q => Some(QueueConfig {
            qdisc: q
                .parse::<Qdisc>()
                .map_err(|e| usage(format!("port {name}: {e} (or none)")))?,
            limit,
            ..QueueConfig::default()
        }),
    };
    Ok(EgressConfig {
        queue,
        dql: dql && queue.is_some(),
        bulk,
        ..base
    })
}
fn yes() -> bool {
    true
}
fn frame_len() -> usize {
    64
}
fn gen_src() -> String {
    "02:00:00:00:00:01".into()
}
fn gen_dst() -> String {
    "02:00:00:00:00:02".into()
}
fn one_flow() -> u8 {
    1
}

impl PortConfig {
    pub(crate) fn name(&self) -> &str {
        match self {
            PortConfig::VhostUser { name, .. }
            | PortConfig::Tap { name, .. }
            | PortConfig::AfPacket { name, .. }
            | PortConfig::Sink { name }
            | PortConfig::Gen { name, .. } => name,
        }
    }
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            PortConfig::VhostUser { .. } => "vhost-user",
            PortConfig::Tap { .. } => "tap",
            PortConfig::AfPacket { .. } => "af-packet",
            PortConfig::Sink { .. } => "sink",
            PortConfig::Gen { .. } => "gen",
        }
    }

    /// The port as a `--port` spec (for messages).
    pub(crate) fn spec(&self) -> String {
        let mut out = format!("{}:", self.kind());
        if let Ok(t) = toml::Table::try_from(self) {
            let kv: Vec<String> = t
                .iter()
                .filter(|(k, _)| k.as_str() != "kind")
                .map(|(k, v)| match v {
                    toml::Value::String(s) => format!("{k}={s}"),
                    v => format!("{k}={v}"),
                })
                .collect();
            out.push_str(&kv.join(","));
        }
        out
    }

    /// What the port holds that no other port may: its socket path or interface.
    pub(crate) fn resource(&self) -> Option<String> {
        match self {
            PortConfig::VhostUser { socket, .. } => Some(format!("socket {}", socket.display())),
            PortConfig::Tap {
                ifname: Some(i), ..
            }
            | PortConfig::AfPacket { ifname: i, .. } => Some(format!("interface {i}")),
            _ => None,
        }
    }
}

/// The checks of one port's settings that need no other port.
pub(crate) fn check_port(p: &PortConfig) -> Result<()> {
    if p.name().is_empty() {
        return Err(usage("a port needs a name"));
    }
    match p {
        PortConfig::VhostUser {
            name,
            queue_pairs,
            qdisc,
            dql,
            bulk,
            limit,
            ..
        } => {
            if *queue_pairs == 0 || usize::from(*queue_pairs) > MAX_STEER {
                return Err(usage(format!(
                    "port {name}: queue_pairs must be 1 to {MAX_STEER}"
                )));
            }
            egress_of(name, qdisc, *dql, *bulk, *limit)?;
            port_policy(p)?;
        }
        PortConfig::Tap { name, io, .. } | PortConfig::AfPacket { name, io, .. } => {
            host_io(name, io)?;
            kernel_egress(p)?;
        }
        PortConfig::Gen {
            name,
            secs,
            delay,
            src,
            dst,
            flows,
            ..
        } => {
            if !(secs.is_finite() && *secs >= 0.0 && delay.is_finite() && *delay >= 0.0) {
                return Err(usage(format!("port {name}: secs and delay must be >= 0")));
            }
            if *flows == 0 {
                return Err(usage(format!("port {name}: flows must be 1 to 255")));
            }
            parse_mac(src)?;
            parse_mac(dst)?;
        }
        PortConfig::Sink { .. } => {}
    }
    Ok(())
}

#[derive(Deserialize, Serialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    #[serde(default, skip_serializing)]
    pub(crate) switch: SwitchTable,
    #[serde(default)]
    pub(crate) port: Vec<PortConfig>,
}

/// A spec's value: integers, booleans and floats become those; everything else is a string
/// (paths, names, MACs).
pub(crate) fn spec_value(v: &str) -> toml::Value {
    let v = v.trim();
    if let Ok(i) = v.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(b) = v.parse::<bool>() {
        toml::Value::Boolean(b)
    } else if let Ok(f) = v.parse::<f64>() {
        toml::Value::Float(f)
    } else {
        toml::Value::String(v.into())
    }
}

/// Parses `KIND:key=value,...` into a port table (values as [`spec_value`]).
pub(crate) fn parse_port_spec(spec: &str) -> Result<PortConfig> {
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut t = toml::Table::new();
    t.insert("kind".into(), toml::Value::String(kind.trim().into()));
    for kv in rest.split(',').filter(|s| !s.trim().is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| usage(format!("--port {spec}: '{kv}' is not key=value")))?;
        t.insert(k.trim().into(), spec_value(v));
    }
    PortConfig::deserialize(toml::Value::Table(t)).map_err(|e| usage(format!("--port {spec}: {e}")))
}

pub(crate) fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    let mut m = [0u8; 6];
    if parts.len() != 6 {
        return Err(usage(format!(
            "'{s}' is not a MAC address (aa:bb:cc:dd:ee:ff)"
        )));
    }
    for (b, p) in m.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| usage(format!("'{s}' is not a MAC address")))?;
    }
    Ok(m)
}

pub(crate) fn fmt_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The whole configuration, checked.
#[derive(Debug)]
struct Config {
    worker: WorkerConfig,
    ctl_socket: PathBuf,
    ctl_group: Option<u32>,
    state: Option<PathBuf>,
    metrics: Option<std::net::SocketAddr>,
    ports: Vec<PortConfig>,
    /// The file's `[switch]` table as read (a reload compares against it).
    switch: SwitchTable,
}

/// A group name or number as a gid.
fn group_id(g: &str) -> Result<u32> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    let c = std::ffi::CString::new(g).map_err(|_| usage(format!("group '{g}'")))?;
    // SAFETY: getgrnam takes a NUL-terminated string and returns a pointer into static
    // storage or null; read at once, before any other call could reuse it.
    let gr = unsafe { libc::getgrnam(c.as_ptr()) };
    if gr.is_null() {
        return Err(usage(format!("ctl_group: no group '{g}'")));
    }
    // SAFETY: non-null, points at a valid `struct group`.
    Ok(unsafe { (*gr).gr_gid })
}

fn load(a: &SwitchArgs) -> Result<Config> {
    let file = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(io(p.display()))?;
            toml::from_str::<FileConfig>(&text)
                .map_err(|e| usage(format!("{}: {e}", p.display())))?
        }
        None => FileConfig::default(),
    };
    let mut ports = file.port;
    for s in &a.ports {
        ports.push(parse_port_spec(s)?);
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in &ports {
        check_port(p)?;
        if !seen.insert(p.name().to_string()) {
            return Err(usage(format!(
                "port names must be unique and non-empty ('{}')",
                p.name()
            )));
        }
    }
    let sw = file.switch.clone();
    let policy = |flag: Option<Policy>, file: &Option<String>, what: &str| -> Result<Policy> {
        match (flag, file) {
            (Some(p), _) => Ok(p),
            (None, Some(s)) => s
                .parse()
                .map_err(|e| usage(format!("[switch] {what}: {e}"))),
            (None, None) => Ok(Policy::Adaptive),
        }
    };
    let batch = a.batch.or(sw.batch).unwrap_or(64);
    if batch == 0 {
        return Err(usage("batch must be at least 1"));
    }
    let workers = a.workers.or(sw.workers).unwrap_or(1);
    if workers == 0 || workers > 64 {
        return Err(usage("--workers must be 1 to 64"));
    }
    let hot = a.rebalance_load.or(sw.rebalance_load).unwrap_or(95.0);
    if !(hot > 0.0 && hot <= 100.0) {
        return Err(usage(
            "--rebalance-load must be a percentage above 0, at most 100",
        ));
    }
    let spare = a.rebalance_spare.or(sw.rebalance_spare);
    if spare.is_some_and(|c| !(c >= 0.0 && c.is_finite())) {
        return Err(usage(
            "--rebalance-spare must be a number of CPUs, 0 or more",
        ));
    }
    let worker = WorkerConfig {
        role: Role::Switch(SwitchConfig {
            aging: Duration::from_secs(a.mac_aging.or(sw.mac_aging).unwrap_or(300).max(1)),
        }),
        policy: policy(a.policy, &sw.policy, "policy")?,
        rx_policy: policy(a.rx_policy, &sw.rx_policy, "rx_policy")?,
        batch,
        cpu: a.cpu.or(sw.cpu),
        tx_call_delay: Duration::from_micros(a.tx_call_delay.or(sw.tx_call_delay).unwrap_or(150)),
        shards: workers,
        egress: EgressConfig::switch_default(),
        rebalance: pvnet_dataplane::RebalanceConfig {
            enabled: a.rebalance.or(sw.rebalance).unwrap_or(true),
            hot: hot / 100.0,
            spare,
            ..Default::default()
        },
    };
    Ok(Config {
        worker,
        ctl_socket: a
            .ctl_socket
            .clone()
            .or(sw.ctl_socket)
            .unwrap_or_else(|| ctl::DEFAULT_CTL_SOCKET.into()),
        ctl_group: a
            .ctl_group
            .clone()
            .or(sw.ctl_group.clone())
            .map(|g| group_id(&g))
            .transpose()?,
        state: a.state.clone().or(sw.state.clone()),
        metrics: a.metrics.or(sw.metrics),
        ports,
        switch: file.switch,
    })
}

/// Counters of a snapshot (a port's, or a queue pair's) as the flat map `pvnet ctl` shows.
pub(crate) fn counters(s: &impl Serialize) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    if let Ok(serde_json::Value::Object(o)) = serde_json::to_value(s) {
        for (k, v) in o {
            match (k.as_str(), v) {
                ("port" | "up" | "end_marker", _) => {}
                ("drops", serde_json::Value::Object(d)) => {
                    for (r, n) in d {
                        m.insert(format!("drops_{r}"), n.as_u64().unwrap_or(0));
                    }
                }
                (_, v) => {
                    if let Some(n) = v.as_u64() {
                        m.insert(k, n);
                    }
                }
            }
        }
    }
    m
}

/// Runs the switch until signalled (or `--duration`); prints the final counters as JSON.
pub fn run(a: &SwitchArgs) -> Result<()> {
    proc::install_stop_handler();
    proc::install_reload_handler();
    if !(a.duration.is_finite() && a.duration >= 0.0) {
        return Err(usage("--duration must be a non-negative number"));
    }
    let cfg = load(a)?;
    let dp = Dataplane::start(cfg.worker)?;
    dp.keep_control_off_workers();
    let stop = Arc::new(AtomicBool::new(false));
    let rt = Arc::new(Runtime::new(dp.clone(), cfg.state.clone()));
    for p in &cfg.ports {
        if let Err(e) = rt.add(p.clone(), Origin::Config) {
            rt.stop_all();
            dp.shutdown();
            return Err(e);
        }
    }
    match rt.restore_state() {
        Ok(0) => {}
        Ok(n) => info!(
            ports = n,
            "ports added at runtime before the restart restored"
        ),
        Err(e) => warn!("state file not read: {e}"),
    }
    if rt.len() == 0 {
        warn!("no ports yet: add them with `pvnet ctl port add` (or --port / a --config file)");
    }
    let status = {
        let rt = rt.clone();
        Arc::new(move || rt.status()) as ctl::StatusFn
    };
    // The `[switch]` table a reload compares against.
    let table = Arc::new(std::sync::Mutex::new(cfg.switch.clone()));
    let reload = {
        let (rt, a, table) = (rt.clone(), a.clone(), table.clone());
        move || -> Result<Vec<String>> {
            let Some(path) = &a.config else {
                return Err(usage("no --config file to reload"));
            };
            let c = load(&a)?;
            let mut notes = rt.reconcile(&c.ports);
            let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
            if *t != c.switch {
                notes.push(format!(
                    "the [switch] table of {} changed: it applies when the switch restarts",
                    path.display()
                ));
                *t = c.switch;
            }
            if notes.is_empty() {
                notes.push("nothing changed".into());
            }
            Ok(notes)
        }
    };
    let reload = Arc::new(reload);
    let apply = {
        let (rt, reload) = (rt.clone(), reload.clone());
        Arc::new(move |op: &ctl::Op| rt.apply(op, &*reload)) as ctl::ApplyFn
    };
    if let Some(dir) = cfg.ctl_socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let server = ctl::Server {
        status: status.clone(),
        apply: Some(apply),
        group: cfg.ctl_group,
    };
    let ctl_thread = ctl::serve_ctl(&cfg.ctl_socket, server, stop.clone())
        .map_err(io(format!("control socket {}", cfg.ctl_socket.display())))?;
    let metrics_thread = match cfg.metrics {
        Some(addr) => {
            let (bound, t) = ctl::serve_metrics(addr, status.clone(), stop.clone())
                .map_err(io(format!("metrics on {addr}")))?;
            info!(%bound, "Prometheus metrics at /metrics");
            Some(t)
        }
        None => None,
    };
    info!(
        ports = rt.len(),
        ctl = %cfg.ctl_socket.display(),
        "switch running"
    );
    // Ready once every port listens and the control socket answers (systemd Type=notify).
    if proc::sd_notify(&format!(
        "READY=1\nSTATUS=switching {} ports, control socket {}",
        rt.len(),
        cfg.ctl_socket.display()
    )) {
        info!("service manager told: ready");
    }
    let deadline = (a.duration > 0.0).then(|| Instant::now() + Duration::from_secs_f64(a.duration));
    while !stop.load(Ordering::Relaxed) {
        if proc::stopping() || deadline.is_some_and(|d| Instant::now() >= d) {
            stop.store(true, Ordering::Relaxed);
            break;
        }
        if proc::take_reload() {
            proc::sd_notify("RELOADING=1");
            match reload() {
                Ok(notes) => {
                    for n in &notes {
                        info!("reload: {n}");
                    }
                }
                Err(e) => error!("reload failed, nothing changed: {e}"),
            }
            proc::sd_notify(&format!("READY=1\nSTATUS=switching {} ports", rt.len()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.stop_all();
    proc::sd_notify("STOPPING=1");
    let _ = ctl_thread.join();
    if let Some(t) = metrics_thread {
        let _ = t.join();
    }
    let last = status();
    dp.shutdown();
    println!("{}", serde_json::json!({ "final": last }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs_parse_into_the_toml_model() {
        assert_eq!(
            parse_port_spec("vhost-user:name=vm1,socket=/tmp/a.sock,client=true").unwrap(),
            PortConfig::VhostUser {
                name: "vm1".into(),
                socket: "/tmp/a.sock".into(),
                client: true,
                queue_pairs: 1,
                offloads: true,
                qdisc: "fq_codel".into(),
                dql: true,
                bulk: true,
                limit: 1024,
                policy: None,
            }
        );
        let e = |spec: &str| match parse_port_spec(spec).unwrap() {
            PortConfig::VhostUser {
                name,
                qdisc,
                dql,
                bulk,
                limit,
                ..
            } => egress_of(&name, &qdisc, dql, bulk, limit),
            _ => unreachable!(),
        };
        let k = |spec: &str| kernel_egress(&parse_port_spec(spec)?).map(Option::unwrap);
        let (tap, sndbuf) =
            k("tap:name=h,ifname=t0,qdisc=fq_codel,limit=256,sndbuf=65536").unwrap();
        let q = tap.queue.expect("a queue");
        assert_eq!(
            (q.qdisc, q.limit, tap.dql, sndbuf),
            (Qdisc::FqCodel, 256, false, Some(65536))
        );
        let (none, sndbuf) = k("af-packet:name=w,ifname=v0").unwrap();
        assert_eq!((none.queue, sndbuf), (None, None), "no queue unless asked");
        assert!(k("af-packet:name=w,ifname=v0,qdisc=red").is_err());
        assert!(
            k("tap:name=h,dql=true").is_err(),
            "no dql key on a kernel port"
        );
        let fifo = e("vhost-user:name=a,socket=/s,qdisc=fifo,dql=false,bulk=false").unwrap();
        assert_eq!(fifo.queue.map(|q| q.qdisc), Some(Qdisc::Fifo));
        assert!(!fifo.dql && !fifo.bulk);
        let none = e("vhost-user:name=a,socket=/s,qdisc=none").unwrap();
        assert!(none.queue.is_none() && !none.dql);
        assert!(e("vhost-user:name=a,socket=/s,qdisc=red").is_err());
        assert!(e("vhost-user:name=a,socket=/s,limit=0").is_err());
        // A port's own policy: parsed and checked with the port, absent by default.
        let pol = |spec: &str| port_policy(&parse_port_spec(spec).unwrap());
        assert_eq!(
            pol("vhost-user:name=a,socket=/s,policy=coalesce:500").unwrap(),
            Some(Policy::Coalesce(Duration::from_micros(500)))
        );
        assert_eq!(pol("vhost-user:name=a,socket=/s").unwrap(), None);
        let bad = parse_port_spec("vhost-user:name=a,socket=/s,policy=fastest").unwrap();
        assert!(check_port(&bad)
            .unwrap_err()
            .to_string()
            .contains("port a: policy"));
        assert_eq!(
            parse_port_spec("gen:name=g,rate=1000,secs=2.5").unwrap(),
            PortConfig::Gen {
                name: "g".into(),
                rate: 1000,
                secs: 2.5,
                delay: 0.0,
                frame_len: 64,
                src: gen_src(),
                dst: gen_dst(),
                flows: 1,
            }
        );
        for bad in [
            "gen:name=g,flows=0",
            "gen:name=g,flows=256",
            "vhost-user:name=a,socket=/s,queue_pairs=0",
            "vhost-user:name=a,socket=/s,queue_pairs=65",
        ] {
            let p = parse_port_spec(bad);
            assert!(
                p.is_err() || p.is_ok_and(|p| check_port(&p).is_err()),
                "{bad}"
            );
        }
        assert!(parse_port_spec("sink:name=s,bogus=1").is_err());
        assert!(parse_port_spec("router:name=r").is_err());
        assert!(parse_port_spec("sink:name").is_err());
    }

    #[test]
    fn toml_file_and_flags_combine() {
        let dir = std::env::temp_dir().join(format!("pvnet-sw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s.toml");
        std::fs::write(
            &f,
            "[switch]\ncpu = 1\nmac_aging = 5\n[[port]]\nkind = \"sink\"\nname = \"s\"\n",
        )
        .unwrap();
        let a = SwitchArgs {
            config: Some(f.clone()),
            ports: vec!["gen:name=g".into()],
            batch: Some(32),
            ..SwitchArgs::default()
        };
        let c = load(&a).unwrap();
        assert_eq!(c.ports.len(), 2);
        assert_eq!(c.worker.cpu, Some(1));
        assert_eq!(c.worker.batch, 32);
        // duplicate names are refused
        let a = SwitchArgs {
            config: Some(f),
            ports: vec!["sink:name=s".into()],
            ..SwitchArgs::default()
        };
        assert!(load(&a).unwrap_err().to_string().contains("unique"));
        // No ports at all is a switch waiting for `pvnet ctl port add`.
        assert!(load(&SwitchArgs::default()).unwrap().ports.is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("02:00:00:00:00:0a").unwrap(), [2, 0, 0, 0, 0, 10]);
        assert!(parse_mac("02:00:00").is_err());
        assert_eq!(fmt_mac([2, 0, 0, 0, 0, 10]), "02:00:00:00:00:0a");
    }
}
