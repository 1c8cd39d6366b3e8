//! The dataplane's threads: shards, and the handle the control plane drives them with.
//!
//! A [`shard`] is one thread that owns a set of ports (for a vhost-user port: the queue pairs
//! placed on it) and runs the poll loop over them; nothing it owns is touched by another
//! thread. The control plane talks to shards through [`Dataplane`], which implements
//! [`DeviceHooks`]: commands go down a channel, a flag says "look at the channel" (one relaxed
//! load per round) and an eventfd wakes a sleeping shard. `stop_queue` and `port_gone` wait
//! for the shard's answer, so when they return the ring is no longer touched and the memory
//! may be unmapped.
//!
//! Placement: a port lives on one shard ([`Dataplane::shard_of`]). Under the learning
//! switch a new port goes to the least busy shard and a vhost-user port may later move
//! ([`balance`] says when, [`Dataplane::move_port`] how); the bench roles deal ports
//! round-robin by id (`forward` keeps a forwarding pair together). Under the learning
//! switch, every pair of shards is joined by a trunk ([`crate::port::trunk`]): each shard
//! switches among its own ports and sends what is for another shard's ports over that
//! shard's trunk (a copy into a ring, then the usual copy into the receiver). One shard by
//! default.

pub(crate) mod balance;
pub(crate) mod shard;

use crate::pkt::PortId;
use crate::poll::Policy;
use crate::port::gen::GenSpec;
use crate::stats::{PortSnapshot, PortStats};
use crate::switch::{MacEntry, SwitchConfig};
use balance::{Balancer, Decision, PortLoad, RebalanceConfig, Sample};
use pvnet_vhost::backend::{DeviceHooks, StartedQueue};
use pvnet_vhost::Notifier;
use shard::{Cmd, Load, Shard};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use virtq::MemTable;

/// What the dataplane does with packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// L2 learning switch between every port, host ports included.
    Switch(SwitchConfig),
    /// Bench: every frontend's packets go to a sink behind its port (reads every byte,
    /// checks sequence numbers).
    Sink,
    /// Bench: as `Sink`, and a generator behind each port fills its frontend's receive ring.
    Gen(GenConfig),
    /// Bench: frontends pair up in connection order (0-1, 2-3, ...) and forward to each other.
    Forward,
    /// Bench: what a frontend sends comes back to it (request/response measurements).
    Echo,
}

/// Settings of the generator behind each port (role [`Role::Gen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenConfig {
    /// Ethernet frame length (virtio-net header excluded).
    pub frame_len: usize,
    /// How long to generate after the receive queue starts; then the end marker goes out.
    pub duration: Duration,
}

/// Dataplane settings.
#[derive(Debug, Clone, Copy)]
pub struct WorkerConfig {
    /// What ports do with packets.
    pub role: Role,
    /// Polling/notification policy of the queues frontends fill (their transmit queues).
    pub policy: Policy,
    /// Policy of the receive queues, while a shard waits for a frontend's buffers.
    pub rx_policy: Policy,
    /// Most chains per ring per round.
    pub batch: u16,
    /// CPU to pin the first shard to (shard `k` goes on the `k`-th CPU after it).
    pub cpu: Option<usize>,
    /// How long a transmit-completion call may be held back (interrupt coalescing, like a
    /// NIC's tx-usecs): calls the driver asked for while this passes go out as one. Never less
    /// than two wake-ups.
    pub tx_call_delay: Duration,
    /// Worker threads (shards).
    pub shards: usize,
    /// The switch's vhost-user ports' egress: queue, scheduler, DQL, bulk dequeue (bench
    /// roles hold packets in their senders instead).
    pub egress: crate::egress::EgressConfig,
    /// Moving ports between shards by load (the learning switch on several shards).
    pub rebalance: RebalanceConfig,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            role: Role::Sink,
            policy: Policy::Adaptive,
            rx_policy: Policy::Adaptive,
            batch: 64,
            cpu: None,
            tx_call_delay: Duration::from_micros(150),
            shards: 1,
            egress: crate::egress::EgressConfig::switch_default(),
            rebalance: RebalanceConfig::default(),
        }
    }
}

/// A port that is not a vhost-user frontend, for the switch.
#[derive(Debug)]
pub enum HostPort {
    /// The host kernel (a tap, or an interface through `AF_PACKET`), how it moves packets,
    /// and whether it reads straight into a frontend's buffers (direct receive).
    Kernel(
        crate::port::kernel::HostDev,
        crate::port::kernel::HostIo,
        bool,
    ),
    /// An interface through `AF_XDP`, its program attached and sockets bound.
    AfXdp(crate::sys::xdp::XdpDev),
    /// VXLAN tunnels, their sockets bound.
    Vxlan(crate::port::vxlan::Underlay),
    /// Consumes and checks.
    Sink,
    /// Produces.
    Gen(GenSpec),
}

impl HostPort {
    /// "tap", "sink" or "gen".
    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            HostPort::Kernel(crate::port::kernel::HostDev::Tap(_), _, _) => "tap",
            HostPort::Kernel(crate::port::kernel::HostDev::Packet(_), _, _) => "af-packet",
            HostPort::AfXdp(_) => "af-xdp",
            HostPort::Vxlan(_) => "vxlan",
            HostPort::Sink => "sink",
            HostPort::Gen(_) => "gen",
        }
    }
}

/// Every port's counters, one block per queue pair (one writer each), summed for display.
pub(crate) type Registry = BTreeMap<PortId, Vec<Arc<PortStats>>>;

struct ShardHandle {
    tx: Sender<Cmd>,
    pending: Arc<AtomicBool>,
    asleep: Arc<AtomicBool>,
    wake: Notifier,
    /// The thread's id (for its CPU time), once it runs.
    tid: Arc<std::sync::atomic::AtomicI32>,
}

/// One worker (shard) as `pvnet ctl` shows it.
#[derive(Debug, Clone, Default, serde::Serialize, PartialEq)]
pub struct WorkerInfo {
    /// Its index.
    pub index: usize,
    /// The CPU it is pinned to, if it is.
    pub cpu: Option<usize>,
    /// Its thread's id (`/proc/<tid>/stat` has its CPU time); 0 before it runs.
    pub tid: i32,
    /// The ports placed on it.
    pub ports: Vec<PortId>,
    /// Packets it sent to other workers over its trunks, and received from them.
    pub handoff_out: u64,
    /// See `handoff_out`.
    pub handoff_in: u64,
    /// Share of the last measured interval it spent in rounds that moved packets, 0 to 1
    /// (polling empty rings and sleeping are not busy).
    pub busy: f64,
    /// Time it has spent in rounds that moved packets since it started, nanoseconds (a
    /// counter: its difference over a window, divided by the packets of that window, is
    /// the worker's cost per packet without its polling of empty rings).
    pub busy_ns: u64,
    /// Ports moved onto it, and off it, since the start.
    pub moved_in: u64,
    /// See `moved_in`.
    pub moved_out: u64,
}

/// Why a port could not move.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    /// Ports move only under the learning switch on several workers.
    #[error("ports move only between the workers of a learning switch with --workers > 1")]
    NotSwitch,
    /// No such worker.
    #[error("no worker {0} (there are {1})")]
    NoWorker(usize, usize),
    /// The port was never placed (no such port).
    #[error("port {0} is not placed on any worker")]
    NotPlaced(PortId),
    /// Only vhost-user ports move (a tap's reads are in flight across rounds).
    #[error("port {0} is not a vhost-user port: only those move")]
    NotVhost(PortId),
    /// The shard did not answer.
    #[error("worker {0} did not hand the port over")]
    NoAnswer(usize),
}

/// Placement and its history, under one lock: a command for a port is sent while the lock
/// is held, so none can go to a shard the port has just left.
#[derive(Debug, Default)]
struct Placement {
    of: BTreeMap<PortId, usize>,
    /// Host ports (taps, sinks, gens): placed, never moved.
    hosts: BTreeSet<PortId>,
    /// The ports spread over several shards: the shard of each lane, lane 0's also in `of`.
    lanes: BTreeMap<PortId, Vec<usize>>,
    /// Each shard's busy share over the last interval.
    busy: Vec<f64>,
    moved_in: Vec<u64>,
    moved_out: Vec<u64>,
}
/// Handle to the shards; the control plane's [`DeviceHooks`].
pub struct Dataplane {
    cfg: WorkerConfig,
    shards: Vec<ShardHandle>,
    registry: Arc<Mutex<Registry>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    placement: Mutex<Placement>,
    loads: Vec<Arc<Load>>,
    quit: Arc<AtomicBool>,
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl Dataplane {
    /// Starts the shards (each measures its wake-up cost, pinned, before this returns).
    pub fn start(cfg: WorkerConfig) -> io::Result<Arc<Self>> {
        let registry = Arc::new(Mutex::new(Registry::new()));
        let n = cfg.shards.max(1);
        let mut shards = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        let loads: Vec<Arc<Load>> = (0..n).map(|_| Arc::default()).collect();
        for (index, load) in loads.iter().enumerate() {
            let (tx, rx) = channel();
            let pending = Arc::new(AtomicBool::new(false));
            let asleep = Arc::new(AtomicBool::new(false));
            let wake = Notifier::new()?;
            let tid = Arc::new(std::sync::atomic::AtomicI32::new(0));
            let tid2 = tid.clone();
            let link = shard::Link {
                rx,
                pending: pending.clone(),
                asleep: asleep.clone(),
                wake_fd: wake.try_clone()?,
                load: load.clone(),
            };
            let mut s = Shard::new(index, cfg, link, registry.clone())?;
            let (measured_tx, measured_rx) = sync_channel::<()>(1);
            let cpu = cfg.cpu.map(|c| (c + index) % crate::sys::online_cpus());
            let thread = std::thread::Builder::new()
                .name(format!("pvnet-shard{index}"))
                .spawn(move || {
                    // SAFETY: gettid takes no arguments and cannot fail.
                    let me = unsafe { libc::syscall(libc::SYS_gettid) };
                    tid2.store(i32::try_from(me).unwrap_or(0), Ordering::Relaxed);
                    s.pin_and_measure(cpu);
                    let _ = measured_tx.send(());
                    s.run(&crate::poll::MonoClock);
                })?;
            let _ = measured_rx.recv_timeout(Duration::from_secs(5));
            threads.push(thread);
            shards.push(ShardHandle {
                tx,
                pending,
                asleep,
                wake,
                tid,
            });
        }
        let dp = Arc::new(Self {
            cfg,
            shards,
            registry,
            threads: Mutex::new(threads),
            placement: Mutex::new(Placement {
                busy: vec![0.0; n],
                moved_in: vec![0; n],
                moved_out: vec![0; n],
                ..Placement::default()
            }),
            loads,
            quit: Arc::new(AtomicBool::new(false)),
        });
        if dp.ports_move() {
            dp.join_shards()?;
            let weak = Arc::downgrade(&dp);
            let quit = dp.quit.clone();
            let t = std::thread::Builder::new()
                .name("pvnet-balance".into())
                .spawn(move || balance_loop(&weak, &quit, cfg.rebalance))?;
            dp.threads.lock().unwrap_or_else(|e| e.into_inner()).push(t);
        }
        Ok(dp)
    }

    fn placement(&self) -> std::sync::MutexGuard<'_, Placement> {
        self.placement.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Measures every shard's busy share and every port's packets since `last` (which it
    /// updates): one interval's [`Sample`].
    fn measure(&self, last: &mut Measured) -> Sample {
        let n = self.shards.len();
        last.shards.resize(n, (0, 0));
        let busy = (0..n)
            .map(|k| {
                let l = &self.loads[k];
                let now = (
                    l.busy_ns.load(Ordering::Relaxed),
                    l.total_ns.load(Ordering::Relaxed),
                );
                let (b, t) = (
                    now.0.saturating_sub(last.shards[k].0),
                    now.1.saturating_sub(last.shards[k].1),
                );
                last.shards[k] = now;
                if t == 0 {
                    0.0
                } else {
                    (b as f64 / t as f64).min(1.0)
                }
            })
            .collect::<Vec<_>>();
        let mut p = self.placement();
        p.busy.clone_from(&busy);
        // Each port's packets; a spread port's by lane (each on its own shard).
        let counts: Vec<(PortId, usize, u64)> = {
            let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
            r.iter()
                .flat_map(|(&id, qps)| {
                    let total = |qs: &[Arc<PortStats>]| {
                        let s = PortSnapshot::sum(id, qs.iter().map(|s| &**s));
                        s.rx_packets + s.tx_packets
                    };
                    match p.lanes.contains_key(&id) {
                        true => (0..qps.len())
                            .map(|k| (id, k, total(&qps[k..=k])))
                            .collect::<Vec<_>>(),
                        false => vec![(id, 0, total(qps))],
                    }
                })
                .collect()
        };
        let ports = counts
            .into_iter()
            .filter_map(|(id, lane, total)| {
                let before = last.ports.insert((id, lane), total).unwrap_or(total);
                let shard = shard::trunk_owner(id)
                    .or_else(|| p.lanes.get(&id).and_then(|l| l.get(lane).copied()))
                    .or_else(|| p.of.get(&id).copied())?;
                Some(PortLoad {
                    id,
                    shard,
                    packets: total.saturating_sub(before),
                    movable: shard::trunk_owner(id).is_none() && !p.hosts.contains(&id),
                })
            })
            .collect();
        // Given, or measured (`/proc/stat` is read only then).
        let spare_cpus =
            self.cfg
                .rebalance
                .spare
                .unwrap_or_else(|| match (crate::sys::cpu_ticks(), last.cpu) {
                    (Some(now), Some(before)) if now.1 > before.1 => {
                        last.cpu = Some(now);
                        let n = crate::sys::online_cpus() as f64;
                        n * now.0.saturating_sub(before.0) as f64 / (now.1 - before.1) as f64
                    }
                    (now, _) => {
                        last.cpu = now;
                        f64::INFINITY
                    }
                });
        Sample {
            busy,
            ports,
            spare_cpus,
        }
    }

    /// Moves a vhost-user port to shard `to`, with its rings, egress queue and counters.
    /// Returns the shard it left (the same if it was there already).
    ///
    /// Every other shard is paused for the move (at a round boundary; `docs/scale.md` has how
    /// long, with the CPUs free and oversubscribed). The old shard first
    /// switches what the paused ones had sent it, so what was on its way to the port reaches
    /// it, then hands the port over and sends its addresses to the new shard. Each paused shard, before going on, learns
    /// where the port's addresses are now and switches what waits in its trunk from the old
    /// shard, so nothing the port sent from there is overtaken by what it sends from its new
    /// shard. No packet is lost or reordered by a move (a packet switched while a shard is
    /// paused cannot be on a stale path). A port whose frontend is not connected just has
    /// its placement changed.
    pub fn move_port(&self, id: PortId, to: usize) -> Result<usize, MoveError> {
        let n = self.shards.len();
        if !self.ports_move() {
            return Err(MoveError::NotSwitch);
        }
        if to >= n {
            return Err(MoveError::NoWorker(to, n));
        }
        let mut p = self.placement();
        let from = *p.of.get(&id).ok_or(MoveError::NotPlaced(id))?;
        if p.hosts.contains(&id) {
            return Err(MoveError::NotVhost(id));
        }
        if from == to {
            return Ok(from);
        }
        let (wait, started) = (Duration::from_secs(5), std::time::Instant::now());
        // A shard that does not answer: the paused ones go on as they were.
        let give_up = |paused: Vec<(usize, Sender<shard::Resume>)>, k| {
            for (_, r) in paused {
                let _ = r.send(shard::Resume::default());
            }
            Err(MoveError::NoAnswer(k))
        };
        let mut paused = Vec::with_capacity(n - 1);
        for k in (0..n).filter(|&k| k != from) {
            let (ack, acked) = sync_channel(1);
            let (resume, resumed) = channel();
            self.send(k, Cmd::Pause(ack, resumed));
            paused.push((k, resume));
            if acked.recv_timeout(wait).is_err() {
                return give_up(paused, k);
            }
        }
        let (tx, rx) = sync_channel(1);
        self.send(from, Cmd::Detach(id, to, tx));
        let Ok(moving) = rx.recv_timeout(wait) else {
            return give_up(paused, from);
        };
        let macs = moving.as_ref().map(|m| m.macs.clone()).unwrap_or_default();
        let mut attach = moving;
        for (k, r) in paused {
            let _ = r.send(if k == to {
                shard::Resume {
                    attach: attach.take(),
                    learn: Some((id, macs.clone())),
                    drain: Some(shard::trunk_id(k, from)),
                }
            } else {
                shard::Resume {
                    attach: None,
                    learn: Some((shard::trunk_id(k, to), macs.clone())),
                    drain: Some(shard::trunk_id(k, from)),
                }
            });
        }
        let paused_us = started.elapsed().as_micros();
        p.of.insert(id, to);
        p.moved_out[from] += 1;
        p.moved_in[to] += 1;
        tracing::info!(port = id, from, to, paused_us, "port moved between workers");
        Ok(from)
    }

    /// Joins every pair of shards by a trunk (a ring each way).
    fn join_shards(&self) -> io::Result<()> {
        use crate::port::trunk::{link, TRUNK_RING_BYTES};
        let n = self.shards.len();
        for a in 0..n {
            for b in a + 1..n {
                let (at_a, at_b) = link(TRUNK_RING_BYTES);
                let end = |peer: usize, r| -> io::Result<Cmd> {
                    let p = &self.shards[peer];
                    Ok(Cmd::Trunk(Box::new(shard::TrunkEnd {
                        peer,
                        ring: r,
                        peer_wake: p.wake.try_clone()?,
                        peer_asleep: p.asleep.clone(),
                    })))
                };
                self.send(a, end(b, at_a)?);
                self.send(b, end(a, at_b)?);
            }
        }
        Ok(())
    }

    /// Each worker: its CPU, thread, ports, traffic over its trunks, busy share and moves.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let (placed, busy, moved_in, moved_out) = {
            let p = self.placement();
            let mut placed: Vec<(PortId, usize)> = p.of.iter().map(|(&id, &k)| (id, k)).collect();
            // A spread port is on each of its lanes' shards (lane 0's is in `of`).
            for (&id, shards) in &p.lanes {
                placed.extend(shards.iter().skip(1).map(|&k| (id, k)));
            }
            (
                placed,
                p.busy.clone(),
                p.moved_in.clone(),
                p.moved_out.clone(),
            )
        };
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut w: Vec<WorkerInfo> = self
            .shards
            .iter()
            .enumerate()
            .map(|(k, s)| WorkerInfo {
                index: k,
                cpu: self.cfg.cpu.map(|c| (c + k) % crate::sys::online_cpus()),
                tid: s.tid.load(Ordering::Relaxed),
                busy: busy.get(k).copied().unwrap_or(0.0),
                busy_ns: self
                    .loads
                    .get(k)
                    .map_or(0, |l| l.busy_ns.load(Ordering::Relaxed)),
                moved_in: moved_in.get(k).copied().unwrap_or(0),
                moved_out: moved_out.get(k).copied().unwrap_or(0),
                ..WorkerInfo::default()
            })
            .collect();
        for (&id, qps) in r.iter() {
            if let Some(k) = shard::trunk_owner(id) {
                if let Some(w) = w.get_mut(k) {
                    let s = PortSnapshot::sum(id, qps.iter().map(|s| &**s));
                    w.handoff_out += s.tx_packets;
                    w.handoff_in += s.rx_packets;
                }
            } else if id & shard::BEHIND == 0 && placed.is_empty() {
                // The bench roles: every port that connected, placed by id.
                w[self.static_shard(id)].ports.push(id);
            }
        }
        // The learning switch: every port placed, connected or not.
        for (id, k) in placed {
            if let Some(w) = w.get_mut(k) {
                w.ports.push(id);
            }
        }
        w
    }

    /// Keeps the calling thread, and the threads it starts from now on (the vhost-user
    /// sessions, the control socket), off the CPUs the shards are pinned to, when other CPUs
    /// are allowed: control work then neither steals a worker's CPU nor wakes across CPUs to
    /// reach it. (A frontend's IOTLB messages, one acked round trip each under a strict
    /// IOMMU, ran at half the rate with their session on the worker's CPU here.)
    pub fn keep_control_off_workers(&self) {
        let Some(cpu) = self.cfg.cpu else { return };
        let n = crate::sys::online_cpus();
        let workers: Vec<usize> = (0..self.shards.len()).map(|i| (cpu + i) % n).collect();
        if let Some(keep) = crate::sys::avoid_cpus(&workers) {
            tracing::info!(?workers, control = ?keep, "control threads kept off the worker CPUs");
        }
    }

    /// The shard a port lives on (see the module docs); a new port of the learning switch
    /// is placed here, on the least busy shard.
    #[cfg(test)]
    pub(crate) fn shard_of(&self, port: PortId) -> usize {
        let mut g = self.routing();
        self.routed(&mut g, port)
    }

    fn place(p: &mut Placement, port: PortId) -> usize {
        if let Some(&k) = p.of.get(&port) {
            return k;
        }
        let mut count = vec![0usize; p.busy.len()];
        for &k in p.of.values() {
            if let Some(c) = count.get_mut(k) {
                *c += 1;
            }
        }
        let k = balance::least_loaded(&p.busy, &count);
        p.of.insert(port, k);
        k
    }

    /// The bench roles' placement: round-robin by id, a forwarding pair together.
    fn static_shard(&self, port: PortId) -> usize {
        let n = self.shards.len();
        let slot = match self.cfg.role {
            Role::Forward => port / 2,
            _ => port,
        };
        usize::try_from(slot).unwrap_or(0) % n
    }

    fn send(&self, shard: usize, c: Cmd) {
        let Some(s) = self.shards.get(shard) else {
            return;
        };
        if s.tx.send(c).is_ok() {
            // Release: the command is in the channel before the shard sees the flag.
            s.pending.store(true, Ordering::Release);
            let _ = s.wake.signal();
        }
    }

    /// Whether ports are placed by load and can move: the learning switch on several shards.
    fn ports_move(&self) -> bool {
        self.shards.len() > 1 && matches!(self.cfg.role, Role::Switch(_))
    }

    /// The placement lock, where ports can move: a command for a port is sent while it is
    /// held, so a move waits for the send, and a command sent before a move is applied
    /// before the port leaves.
    fn routing(&self) -> Option<std::sync::MutexGuard<'_, Placement>> {
        self.ports_move().then(|| self.placement())
    }

    /// The port's shard, under [`Self::routing`]'s guard.
    fn routed(&self, g: &mut Option<std::sync::MutexGuard<'_, Placement>>, port: PortId) -> usize {
        match g {
            Some(p) => Self::place(p, port),
            None => self.static_shard(port),
        }
    }

    /// Sends a command to the port's shard (see [`Self::routing`]).
    fn send_port(&self, port: PortId, c: Cmd) {
        let mut g = self.routing();
        let k = self.routed(&mut g, port);
        self.send(k, c);
    }

    /// Snapshots of every port ever connected, current or gone, each summed over its queue
    /// pairs.
    pub fn snapshots(&self) -> Vec<PortSnapshot> {
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.iter()
            .map(|(&id, qps)| PortSnapshot::sum(id, qps.iter().map(|s| &**s)))
            .collect()
    }

    /// Adds a host port to the switch (its id must not be used by another port). Returns
    /// the workers it runs on: one, or for an `AF_XDP` port with several queues under the
    /// learning switch on several workers, one per lane ([`XdpDev::lanes_on`]).
    ///
    /// [`XdpDev::lanes_on`]: crate::sys::xdp::XdpDev::lanes_on
    pub fn add_host(&self, id: PortId, port: HostPort) -> usize {
        let lanes = match &port {
            HostPort::AfXdp(dev) if self.ports_move() => dev.lanes_on(self.shards.len().min(64)),
            _ => 1,
        };
        let port = match port {
            HostPort::AfXdp(dev) if lanes > 1 => return self.add_lanes(id, dev.into_lanes(lanes)),
            p => p,
        };
        self.placement().hosts.insert(id);
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_insert_with(|| vec![Arc::default()]);
        self.send_port(id, Cmd::AddHost(id, 0, Box::new(port)));
        1
    }

    /// Adds an `AF_XDP` port as lanes, one per shard, on the shards with the fewest ports:
    /// each lane polls its own queues and transmits on them, all under the port's id (its
    /// counters one block per lane). Every shard learns where the lanes are first (the
    /// fabric's rules for what comes over a trunk: [`crate::switch`]'s `Lanes`).
    fn add_lanes(&self, id: PortId, lanes: Vec<crate::sys::xdp::XdpDev>) -> usize {
        let n = lanes.len();
        let mut p = self.placement();
        let mut count = vec![0usize; self.shards.len()];
        for &k in
            p.of.values()
                .chain(p.lanes.values().flat_map(|l| l.iter().skip(1)))
        {
            if let Some(c) = count.get_mut(k) {
                *c += 1;
            }
        }
        let mut shards: Vec<usize> = (0..self.shards.len()).collect();
        shards.sort_by_key(|&k| (count[k], k));
        shards.truncate(n);
        shards.sort_unstable();
        p.hosts.insert(id);
        p.of.insert(id, shards[0]);
        p.lanes.insert(id, shards.clone());
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (0..n).map(|_| Arc::default()).collect());
        let mask = shards.iter().fold(0u64, |m, &k| m | 1 << k);
        for k in 0..self.shards.len() {
            self.send(k, Cmd::Lanes(id, mask));
        }
        for (lane, (dev, &k)) in lanes.into_iter().zip(&shards).enumerate() {
            self.send(k, Cmd::AddHost(id, lane, Box::new(HostPort::AfXdp(dev))));
        }
        tracing::info!(port = id, workers = ?shards, "port spread over workers: a lane each");
        n
    }

    /// Sends a command to every shard the port is on (each lane's, see
    /// [`Self::add_lanes`]; otherwise its one shard), under the placement lock as
    /// [`Self::send_port`]. Returns how many were sent one.
    fn send_port_each(&self, port: PortId, mut c: impl FnMut() -> Cmd) -> usize {
        let mut g = self.routing();
        let lanes = g.as_ref().and_then(|p| p.lanes.get(&port).cloned());
        match lanes {
            Some(shards) => {
                for &k in &shards {
                    self.send(k, c());
                }
                shards.len()
            }
            None => {
                let k = self.routed(&mut g, port);
                self.send(k, c());
                1
            }
        }
    }

    /// Gives a switch port its own egress settings (a port without them takes
    /// [`WorkerConfig::egress`]). A connected port switches at once: what waited in its old
    /// queue is dropped, counted as `reconfigured`. (Each lane of a spread port has its own
    /// queue with these settings.)
    pub fn set_egress(&self, id: PortId, e: crate::egress::EgressConfig) {
        self.send_port_each(id, || Cmd::Egress(id, e));
    }

    /// Gives a vhost-user port its own polling policy for its transmit rings (None: back to
    /// [`WorkerConfig::policy`]). Running rings switch at once, their learned state reset.
    pub fn set_tx_policy(&self, id: PortId, p: Option<Policy>) {
        self.send_port(id, Cmd::Policy(id, p));
    }

    /// Gives a switch port its VLAN settings (None: none, VLAN 0 untagged), at once: every
    /// shard learns them (a port may move between shards), and what was learned on the port
    /// in VLANs it no longer carries is forgotten.
    pub fn set_vlan(&self, id: PortId, mode: Option<crate::switch::vlan::VlanMode>) {
        for k in 0..self.shards.len() {
            self.send(k, Cmd::Vlan(id, mode.clone()));
        }
    }

    /// Deletes a port from the switch: its queues stop (what waited in its egress queue is
    /// counted as dropped, `port_down`), its frames stop being switched, and its settings and
    /// counters are forgotten. Returns its last counters. (A vhost-user port's frontend must
    /// already be disconnected, or it reconnects into a port that no longer exists.)
    pub fn remove_port(&self, id: PortId) -> Option<PortSnapshot> {
        let mut answers = Vec::new();
        self.send_port_each(id, || {
            let (tx, rx) = sync_channel(1);
            answers.push(rx);
            Cmd::Forget(id, tx)
        });
        for rx in answers {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
        let spread = {
            let mut p = self.placement();
            p.of.remove(&id);
            p.hosts.remove(&id);
            p.lanes.remove(&id).is_some()
        };
        if spread {
            for k in 0..self.shards.len() {
                self.send(k, Cmd::Lanes(id, 0));
            }
        }
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.remove(&id)
            .map(|qps| PortSnapshot::sum(id, qps.iter().map(|s| &**s)))
    }

    /// The switch's learned addresses, every shard's (what a shard learned behind a trunk
    /// is another shard's entry: left out), by VLAN and address. Empty for other roles.
    pub fn macs(&self) -> Vec<MacEntry> {
        let mut all = Vec::new();
        for k in 0..self.shards.len() {
            let (tx, rx) = sync_channel(1);
            self.send(k, Cmd::Macs(tx));
            all.extend(
                rx.recv_timeout(Duration::from_secs(2))
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|e| shard::trunk_owner(e.port).is_none()),
            );
        }
        // A host behind a spread port is learned at the lane of each shard that saw it:
        // listed once, with its youngest age.
        all.sort_by_key(|e| (e.vlan, e.mac, e.port, e.age));
        all.dedup_by_key(|e| (e.vlan, e.mac, e.port));
        all
    }

    /// Stops every shard and waits for them.
    pub fn shutdown(&self) {
        self.quit.store(true, Ordering::Relaxed);
        for k in 0..self.shards.len() {
            self.send(k, Cmd::Shutdown);
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl DeviceHooks for Dataplane {
    fn port_connected(&self, port: PortId) {
        self.send_port(port, Cmd::AddPort(port));
    }
    fn start_queue(&self, port: PortId, q: StartedQueue) {
        self.send_port(port, Cmd::Start(port, Box::new(q)));
    }
    fn stop_queue(&self, port: PortId, index: u16) -> Option<u16> {
        let (tx, rx) = sync_channel(1);
        self.send_port(port, Cmd::Stop(port, index, tx));
        rx.recv().ok().flatten()
    }
    /// Never wakes the shard. A sleeping shard touches no ring and applies the command when
    /// it wakes, before anything else: nothing to wait for. A running one applies it at the
    /// top of its next round (it checks `pending` there, and again before it sleeps): with
    /// `wait`, this returns once it has. So a revocation costs the frontend a round trip to
    /// the worker only while the worker is busy, and a grant never does.
    fn set_mem(&self, port: PortId, mem: Arc<MemTable>, wait: bool) {
        let done = Arc::new(AtomicBool::new(false));
        let asleep = {
            // Sent under the placement lock, as `send_port`.
            let mut g = self.routing();
            let Some(s) = self.shards.get(self.routed(&mut g, port)) else {
                return;
            };
            if s.tx
                .send(Cmd::Mem(port, mem, wait.then(|| done.clone())))
                .is_err()
            {
                return;
            }
            // SeqCst store then SeqCst load, against the shard's store of `asleep` then load
            // of `pending` (`Shard::sleep`): at least one side sees the other.
            s.pending.store(true, Ordering::SeqCst);
            s.asleep.load(Ordering::SeqCst)
        };
        if wait && !asleep {
            // A running shard gets to it within a round: spin for that (a blocking wait
            // costs a cross-CPU wake-up, most of an acked IOTLB round trip here), then nap.
            // The command dropped unapplied (the shard gone) leaves the flag's only owner.
            let spin_until = std::time::Instant::now() + Duration::from_micros(200);
            while !done.load(Ordering::Acquire) && Arc::strong_count(&done) > 1 {
                if std::time::Instant::now() < spin_until {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }
    fn announce(&self, port: PortId, mac: [u8; 6]) {
        self.send_port(port, Cmd::Learn(port, mac));
    }
    fn port_gone(&self, port: PortId) {
        let (tx, rx) = sync_channel(1);
        self.send_port(port, Cmd::RemovePort(port, tx));
        let _ = rx.recv();
    }
}

/// What the last measurement saw, to take differences.
#[derive(Debug, Default)]
struct Measured {
    /// Each shard's busy and total nanoseconds.
    shards: Vec<(u64, u64)>,
    /// Each port's packets (a spread port's by lane).
    ports: BTreeMap<(PortId, usize), u64>,
    /// The machine's spare and total CPU ticks.
    cpu: Option<(u64, u64)>,
}

/// The balancer's thread: measures every interval, keeps each shard's busy share for
/// placement and `pvnet ctl`, and moves a port when [`Balancer`] says so. Ends with the
/// dataplane.
fn balance_loop(dp: &std::sync::Weak<Dataplane>, quit: &AtomicBool, cfg: RebalanceConfig) {
    let mut last = Measured::default();
    let mut b = None;
    while !quit.load(Ordering::Relaxed) {
        std::thread::sleep(cfg.interval);
        let Some(dp) = dp.upgrade() else { return };
        let sample = dp.measure(&mut last);
        let b = b.get_or_insert_with(|| Balancer::new(cfg, dp.shards.len()));
        let now = std::time::Instant::now();
        let (port, to, why) = match b.step(&sample, now) {
            Decision::Stay => continue,
            Decision::Move {
                port,
                from,
                to,
                busy,
            } => {
                tracing::info!(
                    port,
                    from,
                    to,
                    busy = ?sample.busy,
                    predicted = ?busy,
                    spare_cpus = sample.spare_cpus,
                    "worker saturated: moving a port"
                );
                (port, to, "move")
            }
            Decision::Undo {
                port,
                from,
                to,
                rate,
            } => {
                tracing::info!(
                    port,
                    from,
                    to,
                    rate_before = rate.0,
                    rate_after = rate.1,
                    "the switch moved fewer packets after the move: moving the port back"
                );
                (port, to, "undo")
            }
        };
        if let Err(e) = dp.move_port(port, to) {
            tracing::warn!(port, to, what = why, "move not made: {e}");
            b.failed(port, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_keeps_what_must_share_a_shard_together() {
        let mk = |role, shards| {
            Dataplane::start(WorkerConfig {
                role,
                shards,
                ..WorkerConfig::default()
            })
            .expect("start")
        };
        let dp = mk(Role::Sink, 2);
        assert_eq!(
            (0..4).map(|p| dp.shard_of(p)).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        dp.shutdown();
        // A forwarding pair (0-1, 2-3) is one shard's.
        let dp = mk(Role::Forward, 2);
        assert_eq!(
            (0..4).map(|p| dp.shard_of(p)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        dp.shutdown();
        // The learning switch: round-robin too (shards are joined by trunks).
        let dp = mk(Role::Switch(SwitchConfig::default()), 2);
        assert_eq!(
            (0..4).map(|p| dp.shard_of(p)).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        dp.shutdown();
    }
}
