//! `pvnet switch`'s configuration: the TOML file's `[switch]` and `[[port]]` tables, the
//! `--port KIND:key=value,...` specs (the same model), and the checks of one port's settings.

use crate::error::{usage, Result};
use pvnet_dataplane::EgressConfig;
use pvnet_dataplane::HostIo;
use pvnet_dataplane::Policy;
use pvnet_dataplane::VlanMode;
use pvnet_dataplane::MAX_STEER;
use pvnet_dataplane::{Qdisc, QueueConfig};
use pvnet_vhost::backend::MIN_MTU;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The `[switch]` table.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SwitchTable {
    pub(super) cpu: Option<usize>,
    pub(super) workers: Option<usize>,
    pub(super) rebalance: Option<bool>,
    pub(super) rebalance_load: Option<f64>,
    pub(super) rebalance_spare: Option<f64>,
    pub(super) policy: Option<String>,
    pub(super) rx_policy: Option<String>,
    pub(super) batch: Option<u16>,
    pub(super) mac_aging: Option<u64>,
    pub(super) tx_call_delay: Option<u64>,
    pub(super) ctl_socket: Option<PathBuf>,
    pub(super) ctl_group: Option<String>,
    pub(super) state: Option<PathBuf>,
    pub(super) metrics: Option<std::net::SocketAddr>,
    pub(super) mtu: Option<u16>,
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
        /// With dql: microseconds a packet should wait in the ring beyond the frontend's
        /// burst; with the frontend's measured pace it caps the limit (0: no cap).
        #[serde(default = "dql_target_us")]
        dql_target_us: u32,
        /// With the cap: a frontend found asleep on an empty ring while the limit held
        /// packets back raises the cap, on trial: kept only if it buys the frontend rate
        /// (default true; false: the target alone).
        #[serde(default = "yes")]
        dql_witness: bool,
        /// Drain the egress queue in bulk (false: one packet per dequeue).
        #[serde(default = "yes")]
        bulk: bool,
        /// Most packets in the egress queue.
        #[serde(default = "qlimit")]
        limit: u32,
        /// fq_codel: mark an ECN-capable packet Congestion Experienced where CoDel would drop
        /// it (false: drop it, as `tc`'s noecn).
        #[serde(default = "yes")]
        ecn: bool,
        /// Polling policy of this port's transmit rings (default: the switch's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<String>,
        /// The MTU offered to the frontend (`VIRTIO_NET_F_MTU`) and the largest it may set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtu: Option<u16>,
        /// 802.1Q: an access port in this VLAN (1 to 4094): its frames untagged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vlan: Option<u32>,
        /// 802.1Q: a trunk carrying these VLANs tagged (`A,B-C`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "vlan_list"
        )]
        trunk: Option<String>,
        /// 802.1Q, with `trunk`: the VLAN of its untagged frames.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<u32>,
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
        /// fq_codel: mark an ECN-capable packet Congestion Experienced where CoDel would drop
        /// it (false: drop it, as `tc`'s noecn).
        #[serde(default = "yes")]
        ecn: bool,
        /// The kernel's send buffer for the port's writes, in bytes (default: the kernel's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sndbuf: Option<u32>,
        /// 802.1Q: an access port in this VLAN (1 to 4094): its frames untagged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vlan: Option<u32>,
        /// 802.1Q: a trunk carrying these VLANs tagged (`A,B-C`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "vlan_list"
        )]
        trunk: Option<String>,
        /// 802.1Q, with `trunk`: the VLAN of its untagged frames.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<u32>,
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
        /// fq_codel: mark an ECN-capable packet Congestion Experienced where CoDel would drop
        /// it (false: drop it, as `tc`'s noecn).
        #[serde(default = "yes")]
        ecn: bool,
        /// The kernel's send buffer for the port's writes, in bytes (default: the kernel's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sndbuf: Option<u32>,
        /// 802.1Q: an access port in this VLAN (1 to 4094): its frames untagged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vlan: Option<u32>,
        /// 802.1Q: a trunk carrying these VLANs tagged (`A,B-C`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "vlan_list"
        )]
        trunk: Option<String>,
        /// 802.1Q, with `trunk`: the VLAN of its untagged frames.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<u32>,
    },
    AfXdp {
        name: String,
        ifname: String,
        /// The interface's queues to take (0..queues), one AF_XDP socket each.
        #[serde(default = "one_queue")]
        queues: u32,
        /// XDP mode: auto (native, else generic), native or generic.
        #[serde(default = "auto")]
        mode: String,
        /// Zero-copy: auto (where the driver has it), true or false.
        #[serde(default = "auto", deserialize_with = "bool_or_str")]
        zerocopy: String,
        /// Take each frame's RX hash from the driver (XDP metadata, native mode), for
        /// steering, instead of hashing the headers: auto (where the interface has hardware
        /// behind it), true or false.
        #[serde(default = "auto", deserialize_with = "bool_or_str")]
        rx_hash: String,
        /// Put back the VLAN tag the kernel or the NIC carried beside a frame, not in it (XDP
        /// metadata, native mode): true (the default) or false.
        #[serde(default = "yes")]
        rx_vlan: bool,
        /// Receive straight into a vhost-user frontend's buffers where the switch sends the
        /// port's every frame to that frontend (direct receive): the sockets' UMEM takes the
        /// frontend's memory, and a frame is at most 1792 bytes (no multi-buffer).
        #[serde(default)]
        direct: bool,
        /// With several workers: the most workers its queues are spread over, a lane each
        /// (auto: one per worker, at most one per queue; 1: every queue on one worker).
        #[serde(default = "auto", deserialize_with = "u32_or_str")]
        lanes: String,
        /// Egress queue scheduler: none (a packet with no transmit frame free waits in its
        /// sender, then is dropped), fq_codel or fifo.
        #[serde(default = "no_qdisc")]
        qdisc: String,
        /// With a queue: a dynamic limit on the transmit frames in flight, learned from the
        /// completion ring (Linux's BQL over a NIC's queue).
        #[serde(default = "yes")]
        dql: bool,
        /// Drain the egress queue in bulk (false: one packet per dequeue).
        #[serde(default = "yes")]
        bulk: bool,
        /// Most packets in the egress queue.
        #[serde(default = "qlimit")]
        limit: u32,
        /// fq_codel: mark an ECN-capable packet Congestion Experienced where CoDel would drop
        /// it (false: drop it, as `tc`'s noecn).
        #[serde(default = "yes")]
        ecn: bool,
        /// 802.1Q: an access port in this VLAN (1 to 4094): its frames untagged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vlan: Option<u32>,
        /// 802.1Q: a trunk carrying these VLANs tagged (`A,B-C`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "vlan_list"
        )]
        trunk: Option<String>,
        /// 802.1Q, with `trunk`: the VLAN of its untagged frames.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<u32>,
    },
    Vxlan {
        name: String,
        /// The outer source address the sockets are bound to.
        local: String,
        /// The tunnel endpoints (one, or several: `remote=` repeated, a TOML array).
        #[serde(deserialize_with = "one_or_many")]
        remote: Vec<String>,
        /// The VXLAN network identifier (0 to 2^24 - 1).
        #[serde(default = "one_vni")]
        vni: u32,
        /// The UDP port datagrams go to and arrive on.
        #[serde(default = "vxlan_port")]
        dstport: u16,
        /// Sockets whose ports flows are spread over as their outer source port (1: one
        /// socket, source port = dstport).
        #[serde(default = "four")]
        srcports: u16,
        /// Open the sockets in this network namespace (`ip netns` name or a path).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        netns: Option<String>,
        /// Runs of equal-sized datagrams to one remote as one segmented send (UDP_SEGMENT).
        #[serde(default = "yes")]
        gso: bool,
        /// Read runs of datagrams the kernel coalesced as one (UDP_GRO).
        #[serde(default = "yes")]
        gro: bool,
        /// 802.1Q: an access port in this VLAN (1 to 4094): its frames untagged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vlan: Option<u32>,
        /// 802.1Q: a trunk carrying these VLANs tagged (`A,B-C`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "vlan_list"
        )]
        trunk: Option<String>,
        /// 802.1Q, with `trunk`: the VLAN of its untagged frames.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<u32>,
    },
    Sink {
        name: String,
        /// 802.1Q: an access port in this VLAN (1 to 4094): its frames untagged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vlan: Option<u32>,
        /// 802.1Q: a trunk carrying these VLANs tagged (`A,B-C`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "vlan_list"
        )]
        trunk: Option<String>,
        /// 802.1Q, with `trunk`: the VLAN of its untagged frames.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<u32>,
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
        /// 802.1Q: an access port in this VLAN (1 to 4094): its frames untagged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vlan: Option<u32>,
        /// 802.1Q: a trunk carrying these VLANs tagged (`A,B-C`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "vlan_list"
        )]
        trunk: Option<String>,
        /// 802.1Q, with `trunk`: the VLAN of its untagged frames.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<u32>,
    },
}

fn one_queue() -> u32 {
    1
}
fn one_vni() -> u32 {
    1
}
fn vxlan_port() -> u16 {
    pvnet_dataplane::vxlan::DEFAULT_PORT
}
fn four() -> u16 {
    4
}

/// A key that takes one string or an array of them (`remote=` given more than once).
fn one_or_many<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// A `vxlan` port's settings as the dataplane takes them, checked.
pub(crate) fn vxlan_config(p: &PortConfig) -> Result<Option<pvnet_dataplane::VxlanConfig>> {
    use pvnet_dataplane::vxlan::{MAX_REMOTES, MAX_SRCPORTS};
    let PortConfig::Vxlan {
        name,
        local,
        remote,
        vni,
        dstport,
        srcports,
        netns,
        gso,
        gro,
        ..
    } = p
    else {
        return Ok(None);
    };
    let ip = |s: &str| {
        s.parse::<std::net::Ipv4Addr>()
            .map_err(|_| usage(format!("port {name}: '{s}' is not an IPv4 address")))
    };
    let local = ip(local)?;
    let mut remotes = Vec::with_capacity(remote.len());
    for r in remote {
        let r = ip(r)?;
        if r == local || remotes.contains(&r) {
            return Err(usage(format!(
                "port {name}: remote {r} is the local address or given twice"
            )));
        }
        remotes.push(r);
    }
    if remotes.is_empty() || remotes.len() > MAX_REMOTES {
        return Err(usage(format!(
            "port {name}: 1 to {MAX_REMOTES} remotes (remote=IP, repeated)"
        )));
    }
    if *vni >= 1 << 24 {
        return Err(usage(format!("port {name}: vni must be 0 to 16777215")));
    }
    if *dstport == 0 {
        return Err(usage(format!("port {name}: dstport must not be 0")));
    }
    if *srcports == 0 || *srcports > MAX_SRCPORTS {
        return Err(usage(format!(
            "port {name}: srcports must be 1 to {MAX_SRCPORTS}"
        )));
    }
    Ok(Some(pvnet_dataplane::VxlanConfig {
        local,
        remotes,
        vni: *vni,
        dstport: *dstport,
        srcports: *srcports,
        netns: netns.clone(),
        gso: *gso,
        gro: *gro,
    }))
}
fn auto() -> String {
    "auto".into()
}

/// A key that takes `true`, `false` or a word (`zerocopy=auto`), as a string.
fn bool_or_str<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum BoolOrStr {
        B(bool),
        S(String),
    }
    Ok(match BoolOrStr::deserialize(d)? {
        BoolOrStr::B(b) => b.to_string(),
        BoolOrStr::S(s) => s,
    })
}

/// A count or a word (`lanes = 2`, `lanes = "auto"`), as a string.
fn u32_or_str<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrStr {
        I(i64),
        S(String),
    }
    Ok(match IntOrStr::deserialize(d)? {
        IntOrStr::I(i) => i.to_string(),
        IntOrStr::S(s) => s,
    })
}

/// A VLAN list (`trunk=`): a number, or a string of numbers and ranges (`"10,20-30"`).
fn vlan_list<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrStr {
        I(i64),
        S(String),
    }
    Ok(Some(match IntOrStr::deserialize(d)? {
        IntOrStr::I(i) => i.to_string(),
        IntOrStr::S(s) => s,
    }))
}

/// An `af-xdp` port's `lanes`: the most workers its queues are spread over (0: auto).
pub(crate) fn xdp_lanes(p: &PortConfig) -> Result<u32> {
    let PortConfig::AfXdp { name, lanes, .. } = p else {
        return Ok(1);
    };
    match lanes.as_str() {
        "auto" => Ok(0),
        n => match n.parse::<u32>() {
            Ok(k @ 1..=64) => Ok(k),
            _ => Err(usage(format!(
                "port {name}: lanes must be auto or 1 to 64, not {n:?}"
            ))),
        },
    }
}

/// A port's 802.1Q settings from its `vlan`, `trunk` and `native` keys (None: none, the
/// untagged segment of every port without settings).
pub(crate) fn vlan_mode(p: &PortConfig) -> Result<Option<VlanMode>> {
    let (vlan, trunk, native) = p.vlan_keys();
    VlanMode::from_keys(vlan, trunk, native).map_err(|e| usage(format!("port {}: {e}", p.name())))
}

/// An `af-xdp` port's settings as the dataplane takes them.
pub(crate) fn xdp_config(p: &PortConfig) -> Result<Option<pvnet_dataplane::xdp::XdpConfig>> {
    let PortConfig::AfXdp {
        name,
        ifname,
        queues,
        mode,
        zerocopy,
        rx_hash,
        rx_vlan,
        direct,
        ..
    } = p
    else {
        return Ok(None);
    };
    if *queues == 0 || *queues > 256 {
        return Err(usage(format!("port {name}: queues must be 1 to 256")));
    }
    Ok(Some(pvnet_dataplane::xdp::XdpConfig {
        ifname: ifname.clone(),
        queues: *queues,
        mode: mode
            .parse()
            .map_err(|e| usage(format!("port {name}: {e}")))?,
        zerocopy: zerocopy
            .parse()
            .map_err(|e| usage(format!("port {name}: {e}")))?,
        rx_hash: pvnet_dataplane::xdp::parse_rx_hash(rx_hash)
            .map_err(|e| usage(format!("port {name}: {e}")))?,
        rx_vlan: *rx_vlan,
        direct: *direct,
    }))
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
fn dql_target_us() -> u32 {
    u32::try_from(pvnet_dataplane::DQL_TARGET.as_micros()).unwrap_or(u32::MAX)
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
        ecn,
        sndbuf,
        ..
    }
    | PortConfig::AfPacket {
        name,
        qdisc,
        bulk,
        limit,
        ecn,
        sndbuf,
        ..
    }) = p
    else {
        return Ok(None);
    };
    Ok(Some((
        egress_of(name, qdisc, (false, 0, false), *bulk, (*limit, *ecn))?,
        *sndbuf,
    )))
}

/// An `AF_XDP` port's egress settings from its `qdisc`, `dql`, `bulk` and `limit` keys
/// (DQL over its transmit frames, without the pace cap: Linux's BQL); None for another kind.
pub(crate) fn xdp_egress(p: &PortConfig) -> Result<Option<EgressConfig>> {
    let PortConfig::AfXdp {
        name,
        qdisc,
        dql,
        bulk,
        limit,
        ecn,
        ..
    } = p
    else {
        return Ok(None);
    };
    egress_of(name, qdisc, (*dql, 0, false), *bulk, (*limit, *ecn)).map(Some)
}

/// A vhost-user port's egress settings from its `qdisc`, `dql`, `dql_target_us`,
/// `dql_witness`, `bulk` and `limit` keys (the three DQL keys together).
pub(crate) fn egress_of(
    name: &str,
    qdisc: &str,
    (dql, dql_target_us, dql_witness): (bool, u32, bool),
    bulk: bool,
    (limit, ecn): (u32, bool),
) -> Result<EgressConfig> {
    let base = EgressConfig::switch_default();
    if limit == 0 || limit > 1 << 20 {
        return Err(usage(format!(
            "port {name}: limit must be 1..={} packets",
            1 << 20
        )));
    }
    if dql_target_us > 1_000_000 {
        return Err(usage(format!(
            "port {name}: dql_target_us must be 0 (no cap) to 1000000 microseconds"
        )));
    }
    let queue = match qdisc {
        "none" => None,
        q => Some(QueueConfig {
            qdisc: q
                .parse::<Qdisc>()
                .map_err(|e| usage(format!("port {name}: {e} (or none)")))?,
            limit,
            ecn,
            ..QueueConfig::default()
        }),
    };
    Ok(EgressConfig {
        queue,
        dql: dql && queue.is_some(),
        dql_target: Duration::from_micros(u64::from(dql_target_us)),
        dql_witness,
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
            | PortConfig::AfXdp { name, .. }
            | PortConfig::Vxlan { name, .. }
            | PortConfig::Sink { name, .. }
            | PortConfig::Gen { name, .. } => name,
        }
    }

    /// Its `vlan`, `trunk` and `native` keys.
    pub(crate) fn vlan_keys(&self) -> (Option<u32>, Option<&str>, Option<u32>) {
        match self {
            PortConfig::VhostUser {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Tap {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::AfPacket {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::AfXdp {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Vxlan {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Sink {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Gen {
                vlan,
                trunk,
                native,
                ..
            } => (*vlan, trunk.as_deref(), *native),
        }
    }

    /// The port with no 802.1Q keys (to tell a change of those alone).
    pub(crate) fn without_vlan(&self) -> Self {
        let mut p = self.clone();
        match &mut p {
            PortConfig::VhostUser {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Tap {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::AfPacket {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::AfXdp {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Vxlan {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Sink {
                vlan,
                trunk,
                native,
                ..
            }
            | PortConfig::Gen {
                vlan,
                trunk,
                native,
                ..
            } => {
                *vlan = None;
                *trunk = None;
                *native = None;
            }
        }
        p
    }
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            PortConfig::VhostUser { .. } => "vhost-user",
            PortConfig::Tap { .. } => "tap",
            PortConfig::AfPacket { .. } => "af-packet",
            PortConfig::AfXdp { .. } => "af-xdp",
            PortConfig::Vxlan { .. } => "vxlan",
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
                .flat_map(|(k, v)| match v {
                    // An array is its key repeated (`remote=a,remote=b`).
                    toml::Value::Array(a) => a.iter().map(|v| (k, v.clone())).collect(),
                    v => vec![(k, v.clone())],
                })
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
            | PortConfig::AfPacket { ifname: i, .. }
            | PortConfig::AfXdp { ifname: i, .. } => Some(format!("interface {i}")),
            PortConfig::Vxlan {
                local,
                dstport,
                netns,
                ..
            } => Some(format!(
                "UDP {local}:{dstport}{}",
                netns
                    .as_ref()
                    .map_or(String::new(), |n| format!(" in netns {n}"))
            )),
            _ => None,
        }
    }
}

impl PortConfig {
    /// The port with the switch-wide MTU where it sets none of its own (vhost-user, tap).
    pub(crate) fn with_mtu(mut self, switch_mtu: Option<u16>) -> Self {
        match &mut self {
            PortConfig::VhostUser { mtu, .. } => *mtu = mtu.or(switch_mtu),
            PortConfig::Tap { mtu, .. } => *mtu = mtu.or(switch_mtu.map(u32::from)),
            _ => {}
        }
        self
    }
}

/// The checks of one port's settings that need no other port.
pub(crate) fn check_port(p: &PortConfig) -> Result<()> {
    if p.name().is_empty() {
        return Err(usage("a port needs a name"));
    }
    vlan_mode(p)?;
    match p {
        PortConfig::VhostUser {
            name,
            queue_pairs,
            qdisc,
            dql,
            dql_target_us,
            dql_witness,
            bulk,
            limit,
            ecn,
            mtu,
            ..
        } => {
            if *queue_pairs == 0 || usize::from(*queue_pairs) > MAX_STEER {
                return Err(usage(format!(
                    "port {name}: queue_pairs must be 1 to {MAX_STEER}"
                )));
            }
            if mtu.is_some_and(|m| m < MIN_MTU) {
                return Err(usage(format!(
                    "port {name}: mtu must be {MIN_MTU} to 65535 (virtio-net's range)"
                )));
            }
            egress_of(
                name,
                qdisc,
                (*dql, *dql_target_us, *dql_witness),
                *bulk,
                (*limit, *ecn),
            )?;
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
        PortConfig::AfXdp { .. } => {
            xdp_config(p)?;
            xdp_egress(p)?;
            xdp_lanes(p)?;
        }
        PortConfig::Vxlan { .. } => {
            vxlan_config(p)?;
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

/// Parses `KIND:key=value,...` into a port table (values as [`spec_value`]). A VLAN list
/// goes on past commas: `trunk=10,20-30,native=5` is `trunk` `10,20-30` and `native` `5`.
pub(crate) fn parse_port_spec(spec: &str) -> Result<PortConfig> {
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut kvs: Vec<(String, String)> = Vec::new();
    for kv in rest.split(',').filter(|s| !s.trim().is_empty()) {
        match (kv.split_once('='), kvs.last_mut()) {
            (Some((k, v)), _) => kvs.push((k.trim().into(), v.into())),
            (None, Some((k, v))) if k == "trunk" => {
                v.push(',');
                v.push_str(kv.trim());
            }
            (None, _) => {
                return Err(usage(format!("--port {spec}: '{kv}' is not key=value")));
            }
        }
    }
    let mut t = toml::Table::new();
    t.insert("kind".into(), toml::Value::String(kind.trim().into()));
    for (k, v) in kvs {
        let v = if k == "trunk" {
            toml::Value::String(v.trim().into())
        } else {
            spec_value(&v)
        };
        // A key given again makes an array (`remote=a,remote=b`).
        match t.get_mut(&k) {
            Some(toml::Value::Array(a)) => a.push(v),
            Some(old) => *old = toml::Value::Array(vec![old.clone(), v]),
            None => {
                t.insert(k, v);
            }
        }
    }
    PortConfig::deserialize(toml::Value::Table(t.clone())).map_err(|e| {
        // The error does not name the key (the kind's fields are read from a buffer): the
        // key without which the rest is read is the one at fault.
        let culprit = t.iter().find(|(k, _)| {
            let mut rest = t.clone();
            rest.remove(*k);
            *k != "kind" && PortConfig::deserialize(toml::Value::Table(rest)).is_ok()
        });
        match culprit {
            Some((k, v)) => {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                usage(format!("--port {spec}: {k}={v}: {e}"))
            }
            None => usage(format!("--port {spec}: {e}")),
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `mtu=` on a vhost-user port, checked against virtio-net's range; the switch-wide MTU
    /// fills in only where a port sets none.
    #[test]
    fn a_ports_mtu_and_the_switch_wide_default() {
        let mtu = |p: &PortConfig| match p {
            PortConfig::VhostUser { mtu, .. } => mtu.map(u32::from),
            PortConfig::Tap { mtu, .. } => *mtu,
            _ => None,
        };
        let own = parse_port_spec("vhost-user:name=a,socket=/s,mtu=9000").unwrap();
        assert_eq!(mtu(&own), Some(9000));
        assert_eq!(mtu(&own.clone().with_mtu(Some(1500))), Some(9000));
        let none = parse_port_spec("vhost-user:name=a,socket=/s").unwrap();
        assert_eq!(mtu(&none.clone().with_mtu(Some(1500))), Some(1500));
        assert_eq!(mtu(&none.with_mtu(None)), None);
        let tap = parse_port_spec("tap:name=t").unwrap();
        assert_eq!(mtu(&tap.with_mtu(Some(9000))), Some(9000));
        assert!(
            check_port(&parse_port_spec("vhost-user:name=a,socket=/s,mtu=67").unwrap()).is_err()
        );
        assert!(parse_port_spec("vhost-user:name=a,socket=/s,mtu=70000").is_err());
    }

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
                dql_target_us: 25,
                dql_witness: true,
                bulk: true,
                limit: 1024,
                ecn: true,
                policy: None,
                mtu: None,
                vlan: None,
                trunk: None,
                native: None,
            }
        );
        let e = |spec: &str| match parse_port_spec(spec).unwrap() {
            PortConfig::VhostUser {
                name,
                qdisc,
                dql,
                dql_target_us,
                dql_witness,
                bulk,
                limit,
                ecn,
                ..
            } => egress_of(
                &name,
                &qdisc,
                (dql, dql_target_us, dql_witness),
                bulk,
                (limit, ecn),
            ),
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
        let x = |spec: &str| xdp_egress(&parse_port_spec(spec)?).map(Option::unwrap);
        let wire = x("af-xdp:name=w,ifname=v0,qdisc=fq_codel").unwrap();
        let q = wire.queue.expect("a queue");
        assert_eq!(
            (q.qdisc, q.limit, wire.dql, wire.dql_target, wire.bulk),
            (Qdisc::FqCodel, 1024, true, Duration::ZERO, true),
            "BQL over the transmit frames by default, no pace cap"
        );
        let fifo = x("af-xdp:name=w,ifname=v0,qdisc=fifo,dql=false,bulk=false,limit=64").unwrap();
        assert_eq!(
            (fifo.queue.map(|q| (q.qdisc, q.limit)), fifo.dql, fifo.bulk),
            (Some((Qdisc::Fifo, 64)), false, false)
        );
        assert_eq!(
            x("af-xdp:name=w,ifname=v0").unwrap().queue,
            None,
            "none unless asked"
        );
        let ecn = |spec: &str| e(spec).unwrap().queue.map(|q| q.ecn);
        assert_eq!(
            ecn("vhost-user:name=a,socket=/s"),
            Some(true),
            "marks by default"
        );
        assert_eq!(ecn("vhost-user:name=a,socket=/s,ecn=false"), Some(false));
        let (t, _) = k("tap:name=h,ifname=t0,qdisc=fq_codel,ecn=false").unwrap();
        assert_eq!(t.queue.map(|q| q.ecn), Some(false));
        assert_eq!(
            x("af-xdp:name=w,ifname=v0,qdisc=fq_codel,ecn=false")
                .unwrap()
                .queue
                .map(|q| q.ecn),
            Some(false)
        );
        assert!(x("af-xdp:name=w,ifname=v0,qdisc=red").is_err());
        assert!(x("af-xdp:name=w,ifname=v0,qdisc=fifo,limit=0").is_err());
        let d = e("vhost-user:name=a,socket=/s").unwrap();
        assert_eq!(
            d.dql_target,
            pvnet_dataplane::DQL_TARGET,
            "the pace cap by default"
        );
        let linux = e("vhost-user:name=a,socket=/s,dql_target_us=0").unwrap();
        assert!(
            linux.dql && linux.dql_target.is_zero(),
            "DQL without the cap"
        );
        assert!(e("vhost-user:name=a,socket=/s,dql_target_us=2000000").is_err());
        assert!(d.dql_witness, "reserve on trial by default");
        assert!(
            !e("vhost-user:name=a,socket=/s,dql_witness=false")
                .unwrap()
                .dql_witness
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
                vlan: None,
                trunk: None,
                native: None,
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

    /// `vlan=`, `trunk=` (a list that goes on past commas) and `native=` on every kind of
    /// port, in a spec and in the file; bad settings refused with what is wrong.
    #[test]
    fn vlan_keys_parse_on_every_port_kind_and_bad_ones_are_refused() {
        let mode = |spec: &str| vlan_mode(&parse_port_spec(spec).unwrap()).unwrap();
        for kind in [
            "vhost-user:name=a,socket=/s",
            "tap:name=a",
            "af-packet:name=a,ifname=v0",
            "af-xdp:name=a,ifname=v0",
            "sink:name=a",
            "gen:name=a",
        ] {
            assert_eq!(mode(kind), None, "{kind}: no keys, no VLAN");
            assert_eq!(
                mode(&format!("{kind},vlan=10")),
                Some(VlanMode::Access(10)),
                "{kind}"
            );
            let t = mode(&format!("{kind},trunk=10,20-22,native=5")).expect("a trunk");
            assert_eq!(t.to_string(), "trunk 10,20-22 native 5", "{kind}");
            // The list may be one number.
            let t = mode(&format!("{kind},trunk=7")).expect("a trunk");
            assert_eq!(t.to_string(), "trunk 7");
        }
        let f: FileConfig = toml::from_str(
            "[[port]]\nkind = \"tap\"\nname = \"t\"\ntrunk = \"100-102,200\"\nnative = 1\n\
             [[port]]\nkind = \"sink\"\nname = \"s\"\nvlan = 100\n\
             [[port]]\nkind = \"sink\"\nname = \"u\"\ntrunk = 300\n",
        )
        .unwrap();
        let m: Vec<String> = f
            .port
            .iter()
            .map(|p| vlan_mode(p).unwrap().unwrap().to_string())
            .collect();
        assert_eq!(m, ["trunk 100-102,200 native 1", "vlan 100", "trunk 300"]);
        for (bad, why) in [
            ("sink:name=a,vlan=10,trunk=20", "not both"),
            ("sink:name=a,vlan=10,native=20", "not both"),
            ("sink:name=a,native=20", "native= needs trunk="),
            ("sink:name=a,vlan=0", "out of range"),
            ("sink:name=a,vlan=4095", "out of range"),
            ("sink:name=a,trunk=1-5000", "out of range"),
            ("sink:name=a,trunk=30-20", "is empty"),
            ("sink:name=a,trunk=10,native=4095", "out of range"),
            ("sink:name=a,trunk=x", "not a VLAN"),
        ] {
            let e = check_port(&parse_port_spec(bad).unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains("port a: ") && e.contains(why), "{bad}: {e}");
        }
        assert!(parse_port_spec("sink:name=a,vlan=-1").is_err());
        assert!(
            parse_port_spec("sink:name=a,10").is_err(),
            "a bare word after a key other than trunk"
        );
        // A VLAN-only change is told apart from any other.
        let a = parse_port_spec("tap:name=a,vlan=10").unwrap();
        let b = parse_port_spec("tap:name=a,trunk=10,20").unwrap();
        assert_eq!(a.without_vlan(), b.without_vlan());
        assert_ne!(
            a.without_vlan(),
            parse_port_spec("tap:name=a,mtu=9000").unwrap()
        );
        // And it survives the round trip through the state file and `port set`'s table.
        let t = toml::Table::try_from(&b).unwrap();
        assert_eq!(PortConfig::deserialize(toml::Value::Table(t)).unwrap(), b);
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("02:00:00:00:00:0a").unwrap(), [2, 0, 0, 0, 0, 10]);
        assert!(parse_mac("02:00:00").is_err());
        assert_eq!(fmt_mac([2, 0, 0, 0, 0, 10]), "02:00:00:00:00:0a");
    }

    #[test]
    fn af_xdp_spec_parses_with_defaults_and_refuses_bad_values() {
        use pvnet_dataplane::xdp::{ModeReq, ZeroCopy};
        let p = parse_port_spec("af-xdp:name=w,ifname=v0").unwrap();
        assert_eq!(p.kind(), "af-xdp");
        assert_eq!(p.resource().as_deref(), Some("interface v0"));
        let c = xdp_config(&p).unwrap().unwrap();
        assert_eq!(
            (c.queues, c.mode, c.zerocopy, c.rx_hash, c.rx_vlan, c.direct),
            (1, ModeReq::Auto, ZeroCopy::Auto, None, true, false)
        );
        let p = parse_port_spec(
            "af-xdp:name=w,ifname=v0,queues=2,mode=generic,zerocopy=false,rx_hash=false,rx_vlan=false,direct=true",
        )
        .unwrap();
        let c = xdp_config(&p).unwrap().unwrap();
        assert_eq!(
            (c.queues, c.mode, c.zerocopy, c.rx_hash, c.rx_vlan, c.direct),
            (2, ModeReq::Generic, ZeroCopy::Off, Some(false), false, true)
        );
        assert_eq!(xdp_lanes(&p).unwrap(), 0, "lanes=auto by default");
        let p = parse_port_spec("af-xdp:name=w,ifname=v0,queues=4,lanes=2").unwrap();
        assert_eq!(xdp_lanes(&p).unwrap(), 2);
        for bad in [
            "af-xdp:name=w,ifname=v0,mode=fast",
            "af-xdp:name=w,ifname=v0,zerocopy=maybe",
            "af-xdp:name=w,ifname=v0,rx_hash=sometimes",
            "af-xdp:name=w,ifname=v0,queues=0",
            "af-xdp:name=w,ifname=v0,lanes=0",
            "af-xdp:name=w,ifname=v0,lanes=65",
            "af-xdp:name=w,ifname=v0,lanes=many",
        ] {
            let p = parse_port_spec(bad).unwrap();
            assert!(check_port(&p).is_err(), "{bad}");
        }
        assert!(
            parse_port_spec("af-xdp:name=w").is_err(),
            "ifname is needed"
        );
        let e = parse_port_spec("af-xdp:name=w,ifname=v0,rx_vlan=auto").unwrap_err();
        assert!(e.to_string().contains("rx_vlan=auto: invalid type"), "{e}");
    }

    #[test]
    fn vxlan_spec_parses_remotes_repeated_and_refuses_bad_values() {
        let p = parse_port_spec("vxlan:name=t,local=10.1.0.1,remote=10.1.0.2").unwrap();
        assert_eq!(p.kind(), "vxlan");
        assert_eq!(p.resource().as_deref(), Some("UDP 10.1.0.1:4789"));
        let c = vxlan_config(&p).unwrap().unwrap();
        assert_eq!(
            (c.remotes.len(), c.vni, c.dstport, c.srcports, c.netns),
            (1, 1, 4789, 4, None)
        );
        assert!(c.gso, "segmented sends by default");
        let p = parse_port_spec("vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,gso=false").unwrap();
        assert!(!vxlan_config(&p).unwrap().unwrap().gso);
        let spec = "vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,remote=10.1.0.3,vni=42,dstport=8472,srcports=1,netns=far";
        let p = parse_port_spec(spec).unwrap();
        let c = vxlan_config(&p).unwrap().unwrap();
        assert_eq!(
            c.remotes,
            [
                "10.1.0.2".parse::<std::net::Ipv4Addr>().unwrap(),
                "10.1.0.3".parse().unwrap()
            ]
        );
        assert_eq!((c.vni, c.dstport, c.srcports), (42, 8472, 1));
        assert_eq!(c.netns.as_deref(), Some("far"));
        // The spec it prints parses back to the same port (remotes as the key repeated).
        assert!(
            p.spec().contains("remote=10.1.0.2,remote=10.1.0.3"),
            "{}",
            p.spec()
        );
        assert_eq!(parse_port_spec(&p.spec()).unwrap(), p);
        // The TOML form: one remote as a string, or an array.
        let f: FileConfig = toml::from_str(
            "[[port]]\nkind = \"vxlan\"\nname = \"t\"\nlocal = \"10.1.0.1\"\nremote = [\"10.1.0.2\", \"10.1.0.3\"]\nvni = 7\n",
        )
        .unwrap();
        let c = vxlan_config(&f.port[0]).unwrap().unwrap();
        assert_eq!((c.remotes.len(), c.vni), (2, 7));
        for bad in [
            "vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,vni=16777216",
            "vxlan:name=t,local=10.1.0.1,remote=10.1.0.1",
            "vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,remote=10.1.0.2",
            "vxlan:name=t,local=host,remote=10.1.0.2",
            "vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,dstport=0",
            "vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,srcports=0",
            "vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,srcports=65",
        ] {
            let p = parse_port_spec(bad);
            assert!(
                p.is_err() || p.is_ok_and(|p| check_port(&p).is_err()),
                "{bad}"
            );
        }
        assert!(
            parse_port_spec("vxlan:name=t,local=10.1.0.1").is_err(),
            "a remote is needed"
        );
        assert!(parse_port_spec("vxlan:name=t,local=10.1.0.1,remote=10.1.0.2,vni=-1").is_err());
    }
}
