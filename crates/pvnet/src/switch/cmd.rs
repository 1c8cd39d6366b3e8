//! `pvnet switch`: the daemon. Ports from a TOML file and/or `--port` flags: vhost-user
//! (server socket or client with reconnect), tap (the host kernel, offloads on), sink and gen;
//! an L2 learning switch between them (`pvnet_dataplane::switch`); `pvnet ctl` on a control
//! socket, Prometheus metrics on an optional address; final counters as JSON on stdout.

use super::config::{check_port, parse_port_spec, FileConfig, PortConfig, SwitchTable};
use super::runtime::{Origin, Runtime};
use crate::args::{DataplaneArgs, PollArgs};
use crate::ctl;
use crate::error::{io, usage, Result};
use crate::proc;
use clap::Args;
use pvnet_dataplane::EgressConfig;
use pvnet_dataplane::Policy;
use pvnet_dataplane::SwitchConfig;
use pvnet_dataplane::{Dataplane, Role, WorkerConfig};
use pvnet_vhost::backend::MIN_MTU;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
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
      [,qdisc=fq_codel|fifo|none][,dql=true][,dql_target_us=25][,dql_witness=true]
      [,bulk=true][,limit=1024][,ecn=true]:
      packets that find the frontend's receive ring full wait in this port's egress queue
      (copied; the sender goes on): fq_codel (flow queues, CoDel: target 5 ms, interval
      100 ms; a packet CoDel would drop whose sender declared ECN-capable transport is
      marked Congestion Experienced and sent instead, counted ecn_marked, as Linux's
      fq_codel does by default; ecn=false drops it, as tc's noecn) or fifo, at most limit packets, drained in bulk each round (bulk=false: one
      packet per dequeue); dql bounds how many buffers of the ring pvnet fills ahead of the
      frontend (dynamic queue limits, learned from the buffers it gives back), and at most
      the frontend's burst plus what it takes in dql_target_us at its measured pace
      (0: no such cap); each time the frontend is found asleep on an empty ring while
      the limit held packets back it is counted (dql_idle), and the cap grows a little
      for it, on trial: kept only if the frontend takes more with it than without it (a
      guest whose NAPI runs dry and waits for its interrupt), not for one that sleeps on
      its own clock (dql_trials, dql_kept; dql_witness=false: the target alone;
      docs/egress.md); qdisc=none: no queue, a packet waits in its sender up to
      2 ms, then is dropped (no_buffer). Drops: queue_limit, aqm.
      [,policy=coalesce:500]: this port's transmit rings are polled by their own policy
      (--policy's values; default: the switch's --policy), e.g. coalesce for a bulk
      guest whose CPU matters more than a few hundred microseconds of latency.
      [,mtu=9000]: offers VIRTIO_NET_F_MTU and takes the MTU the frontend sets
      (VHOST_USER_NET_SET_MTU, QEMU's host_mtu=) up to it; without mtu= any the frontend
      sets. A frame longer than a port's MTU + 18 (Ethernet and one VLAN tag; GSO packets
      excepted) is not sent to it: dropped, counted too_big at its sender. A tap's, an
      AF_PACKET or an AF_XDP interface's MTU is the interface's (tap: mtu= sets it at the
      start), followed within a second when it changes (ip link set dev X mtu N).
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
      [,qdisc=none|fq_codel|fifo][,bulk=true][,limit=1024][,ecn=true][,sndbuf=BYTES]: an egress queue
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
      [,qdisc=none|fq_codel|fifo][,bulk=true][,limit=1024][,ecn=true][,sndbuf=BYTES]: as for the tap
      (sndbuf: SO_SNDBUF, default net.core.wmem_default; the kernel's queue fills when the
      interface's qdisc holds packets, e.g. under a rate limit).
  af-xdp:name=wire,ifname=veth0[,queues=1][,mode=auto|native|generic][,zerocopy=auto|true|false]
      [,rx_hash=auto|true|false][,rx_vlan=true|false][,direct=false]
      an existing interface through AF_XDP sockets (one per queue, 0..queues) and an XDP
      program pvnet loads and attaches (removed with the port, or when pvnet exits; an
      interface that already has a program is refused). mode=auto: native XDP, else
      generic; `pvnet ctl ports` says which, copy or zero-copy, multi-buffer (jumbo
      frames: the MTU is the interface's, up to 19182 with AF_XDP multi-buffer, 3822
      without), rx-vlan (native mode, Linux 6.8: a VLAN tag the kernel or the NIC carried
      beside the frame, as a bridge or a VLAN device over a veth does, or a NIC's receive
      VLAN offload, is put back in it; in generic mode, or with rx_vlan=false, it is lost)
      and rx-hash (native
      mode, a driver with XDP metadata: each frame's RX hash from the driver steers it, not
      a hash of its headers; rx_hash=auto: only where the interface has hardware behind it,
      since a veth's driver would hash in software).
      [,direct=true]: where the switch sends every frame of the port to one vhost-user
      frontend (two ports, or a fixed wiring), the kernel copies each frame straight into
      that frontend's receive buffers (the sockets' memory is rebuilt over the frontend's
      when it connects; counted as rx_direct): the hop's one copy is the kernel's. Only for
      a frontend with one receive ring, 12-byte headers, no IN_ORDER, no IOMMU, whose
      buffers hold 1804 bytes (DPDK's do; a Linux guest's mergeable ones are smaller and
      take the copy), and frames of up to 1792 bytes (no multi-buffer). Default false.
      No offloads: checksums
      and GSO packets sent to it are completed in software (sw_csum, sw_gso). Needs root
      (CAP_BPF, CAP_NET_ADMIN, CAP_NET_RAW) and AF_XDP in the kernel (docs/afxdp.md). XDP
      frames carry no checksum metadata: on a veth, turn the kernel's end's transmit
      checksum offload off (ethtool -K PEER tx off), or its TCP/UDP arrive unfinished.
      [,lanes=auto|N]: with several workers, its queues are spread over them, a lane of
      sockets per worker (auto: one per worker, at most one per queue; 1: all on one
      worker): each worker reads the queues of its lane and sends out on them, so nothing
      crosses between workers on its way to or from the wire.
      [,qdisc=none|fq_codel|fifo][,dql=true][,bulk=true][,limit=1024][,ecn=true]: an egress queue as
      for vhost-user (default none: a packet that finds no transmit frame free waits in
      its sender up to 1 ms, then is dropped, no_buffer). The device queue beneath it is
      the transmit rings and their frames (1024 a queue); dql=true bounds the frames in
      flight by what the completion ring shows the kernel (a NIC's driver, after its DMA)
      gets through, as Linux's BQL does a NIC's queue: the backlog waits in pvnet's queue,
      where fq_codel orders it.
  vxlan:name=t,local=IP,remote=IP[,remote=IP...][,vni=1][,dstport=4789][,srcports=4][,netns=NS][,gso=true][,gro=true]
      VXLAN tunnels (RFC 7348) to other hosts over the host's UDP stack, interoperating
      with Linux's vxlan device, OVS and VPP: one VNI per port, a plain L2 port to the
      switch. Sockets bound to local:dstport (receives; datagrams from addresses other than
      the remotes are dropped, filtered); frames to an inner address learned behind a
      remote go to it alone, broadcast/multicast/unknown unicast to every remote (head-end
      replication). srcports=N: N sockets on free ports that flows are spread over as
      their outer source port (by inner flow hash); 1: all from dstport. The port's MTU is
      the underlay path's less 50 (outer IPv4, UDP, VXLAN and the inner Ethernet header):
      behind a 1500-byte underlay, give guests mtu=1450 (a longer frame is dropped,
      too_big). netns=NS opens the sockets in another network namespace (ip netns). Wrong
      VNI or flags: invalid. No offloads (checksums and GSO completed in software).
      tx_packets counts datagrams (a frame flooded to N remotes counts N). gso=true: a run
      of equal-sized frames to one remote goes as one segmented send (UDP_SEGMENT; outer
      UDP checksums on), falling back to a datagram per send where the underlay's device
      cannot (no checksum offload); gso=false: zero outer checksums. gro=true: a run of
      datagrams the kernel coalesced (a peer's segmented send, a NIC's GRO) is read as
      one and split back (UDP_GRO; 32 slots of 64 KiB). docs/overlay.md.
  sink:name=s          consumes everything it is sent (reads every byte, checks bench frames)
  gen:name=g[,rate=PPS][,secs=S][,delay=S][,frame_len=64][,src=MAC][,dst=MAC][,flows=1]
      bench frames at PPS (0: as fast as receivers take them) for S seconds (0: forever),
      starting delay seconds after a receiver appears; then an end marker. flows=N (up to
      255) spreads them over N source addresses (the fifth byte xor 0..N, 32 frames in a
      row from each), so that a multiqueue port's flow hash puts them on all its rings.

VLANS (802.1Q, any kind of port above; docs/vlan.md):
  [,vlan=N]            an access port: its frames are untagged, in VLAN N (1 to 4094) inside
                       the switch; a tagged frame it sends is dropped (vlan_filtered)
  [,trunk=A,B-C][,native=N]
                       a trunk: frames of VLANs A and B..C pass tagged; with native=N its
                       untagged frames are in VLAN N and N leaves it untagged (without it, an
                       untagged frame is dropped, vlan_filtered, as is a VLAN not listed)
      A port with neither is in the untagged segment of every port without VLAN settings
      (as before VLANs: its tagged frames are just frames). Addresses are learned per
      VLAN (pvnet ctl macs shows it); a flood reaches only ports of its VLAN. A frame
      from an access port leaves a trunk tagged, and a tagged one leaves an access port
      untagged: the tag is inserted or removed as the frame is copied, checksum and GSO
      offsets moved by 4 bytes. A tag adds 4 bytes: a port's MTU + 18 covers it.
      Change at runtime: pvnet ctl port set NAME trunk=10,20 (or vlan=, native=).
      e.g. --port vhost-user:name=vm1,socket=/tmp/vm1.sock,vlan=10
           --port af-packet:name=up,ifname=eth1,trunk=10,20-29,native=1

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
  socket = \"/tmp/vm1.sock\"
  vlan = 10                            (or trunk = \"10,20-29\", native = 1)
  [[port]]
  kind = \"vxlan\"
  name = \"t\"
  local = \"192.0.2.1\"
  remote = [\"192.0.2.2\", \"192.0.2.3\"]
  vni = 42";

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
    #[command(flatten)]
    pub dp: DataplaneArgs,
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
    /// The MTU of every vhost-user and tap port that sets none of its own (their `mtu=`),
    /// e.g. 9000 for jumbo frames end to end. Default: none (a vhost-user port takes the
    /// frontend's, a tap keeps the kernel's 1500).
    #[arg(long)]
    pub mtu: Option<u16>,
    /// Stop after this many seconds (0: run until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0.0)]
    pub secs: f64,
}

/// The whole configuration, checked.
#[derive(Debug)]
struct Config {
    worker: WorkerConfig,
    ctl_socket: PathBuf,
    ctl_group: Option<u32>,
    state: Option<PathBuf>,
    metrics: Option<std::net::SocketAddr>,
    /// The MTU of ports that set none.
    mtu: Option<u16>,
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
    let mtu = a.mtu.or(sw.mtu);
    if mtu.is_some_and(|m| m < MIN_MTU) {
        return Err(usage(format!("--mtu must be {MIN_MTU} to 65535")));
    }
    let ports: Vec<PortConfig> = ports.into_iter().map(|p| p.with_mtu(mtu)).collect();
    let policy = |flag: Option<Policy>, file: &Option<String>, what: &str| -> Result<Policy> {
        match (flag, file) {
            (Some(p), _) => Ok(p),
            (None, Some(s)) => s
                .parse()
                .map_err(|e| usage(format!("[switch] {what}: {e}"))),
            (None, None) => Ok(Policy::Adaptive),
        }
    };
    let batch = a.dp.poll.batch.or(sw.batch).unwrap_or(PollArgs::BATCH);
    if batch == 0 {
        return Err(usage("batch must be at least 1"));
    }
    let workers = a.dp.workers.or(sw.workers).unwrap_or(1);
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
        policy: policy(a.dp.poll.policy, &sw.policy, "policy")?,
        rx_policy: policy(a.dp.rx_policy, &sw.rx_policy, "rx_policy")?,
        batch,
        cpu: a.dp.poll.cpu.or(sw.cpu),
        tx_call_delay: Duration::from_micros(
            a.dp.tx_call_delay
                .or(sw.tx_call_delay)
                .unwrap_or(DataplaneArgs::TX_CALL_DELAY_US),
        ),
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
        mtu,
        ports,
        switch: file.switch,
    })
}

/// Adds the configuration's ports, then those of the state file.
fn add_ports(rt: &Runtime, ports: &[PortConfig]) -> Result<()> {
    for p in ports {
        rt.add(p.clone(), Origin::Config)?;
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
    Ok(())
}

/// What a reload does (`SIGHUP`, `pvnet ctl reload`): reads `--config` again and applies its
/// ports; a change of its `[switch]` table (`table`, as read last) applies at a restart.
fn reloader(
    rt: Arc<Runtime>,
    a: SwitchArgs,
    table: SwitchTable,
) -> impl Fn() -> Result<Vec<String>> + Send + Sync + 'static {
    let table = std::sync::Mutex::new(table);
    move || {
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
}

/// Where the switch answers: the control socket, and the metrics endpoint if asked for.
struct Endpoints {
    ctl_socket: PathBuf,
    ctl_group: Option<u32>,
    metrics: Option<std::net::SocketAddr>,
}

/// Starts the control socket's thread and the metrics' (if any) until `stop`.
fn serve(
    at: &Endpoints,
    status: &ctl::StatusFn,
    apply: ctl::ApplyFn,
    stop: &Arc<AtomicBool>,
) -> Result<(JoinHandle<()>, Option<JoinHandle<()>>)> {
    if let Some(dir) = at.ctl_socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let server = ctl::Server {
        status: status.clone(),
        apply: Some(apply),
        group: at.ctl_group,
    };
    let ctl_thread = ctl::serve_ctl(&at.ctl_socket, server, stop.clone())
        .map_err(io(format!("control socket {}", at.ctl_socket.display())))?;
    let metrics_thread = match at.metrics {
        Some(addr) => {
            let (bound, t) = ctl::serve_metrics(addr, status.clone(), stop.clone())
                .map_err(io(format!("metrics on {addr}")))?;
            info!(%bound, "Prometheus metrics at /metrics");
            Some(t)
        }
        None => None,
    };
    Ok((ctl_thread, metrics_thread))
}

/// Waits for a signal or the deadline (`secs`, 0: none), reloading on `SIGHUP`.
fn main_loop(secs: f64, stop: &AtomicBool, rt: &Runtime, reload: &dyn Fn() -> Result<Vec<String>>) {
    let deadline = (secs > 0.0).then(|| Instant::now() + Duration::from_secs_f64(secs));
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
}

/// Runs the switch until signalled (or `--secs`); prints the final counters as JSON.
pub fn run(a: &SwitchArgs) -> Result<()> {
    proc::install_stop_handler();
    proc::install_reload_handler();
    if !(a.secs.is_finite() && a.secs >= 0.0) {
        return Err(usage("--secs must be a non-negative number"));
    }
    let Config {
        worker,
        ctl_socket,
        ctl_group,
        state,
        metrics,
        mtu,
        ports,
        switch,
    } = load(a)?;
    let dp = Dataplane::start(worker)?;
    dp.keep_control_off_workers();
    let stop = Arc::new(AtomicBool::new(false));
    let rt = Arc::new(Runtime::new(dp.clone(), state).with_mtu(mtu));
    if let Err(e) = add_ports(&rt, &ports) {
        rt.stop_all();
        dp.shutdown();
        return Err(e);
    }
    let status = {
        let rt = rt.clone();
        Arc::new(move || rt.status()) as ctl::StatusFn
    };
    let reload = Arc::new(reloader(rt.clone(), a.clone(), switch));
    let apply = {
        let (rt, reload) = (rt.clone(), reload.clone());
        Arc::new(move |op: &ctl::Op| rt.apply(op, &*reload)) as ctl::ApplyFn
    };
    let at = Endpoints {
        ctl_socket,
        ctl_group,
        metrics,
    };
    let (ctl_thread, metrics_thread) = serve(&at, &status, apply, &stop)?;
    info!(
        ports = rt.len(),
        ctl = %at.ctl_socket.display(),
        "switch running"
    );
    // Ready once every port listens and the control socket answers (systemd Type=notify).
    if proc::sd_notify(&format!(
        "READY=1\nSTATUS=switching {} ports, control socket {}",
        rt.len(),
        at.ctl_socket.display()
    )) {
        info!("service manager told: ready");
    }
    main_loop(a.secs, &stop, &rt, &*reload);
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
            dp: DataplaneArgs {
                poll: PollArgs {
                    batch: Some(32),
                    ..PollArgs::default()
                },
                ..DataplaneArgs::default()
            },
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
}
