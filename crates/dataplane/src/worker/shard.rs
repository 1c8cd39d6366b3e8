//! One shard: a thread that owns its ports and runs the poll loop over them.
//!
//! A round: every port's burst through the switch ([`Fabric::round`]); every port says what
//! its queues want ([`Port::idle`] into a [`Settle`]); if none wants polling, arm them all
//! (arm, fence, re-check), and only if nothing arrived meanwhile sleep in epoll until a kick,
//! a command, or the earliest deadline (timerfd). The decisions are the pure
//! [`crate::poll::plan`]; this file only does the I/O around them.

use super::{GenConfig, HostPort, Registry, Role, WorkerConfig};
use crate::egress::{EgressConfig, HoldPolicy, HOLD};
use crate::pkt::PortId;
use crate::poll::plan::{call_bound, Plan, Settle};
use crate::poll::{Clock, Policy, WakeCost};
use crate::port::gen::{GenPort, GenSpec};
use crate::port::kernel::KernelPort;
use crate::port::sink::{Counting, SinkPort};
use crate::port::trunk::{self, TrunkPort};
use crate::port::vhost::{VhostConfig, VhostPort};
use crate::port::{AnyPort, Port};
use crate::stats::PortStats;
use crate::switch::vlan::VlanMode;
use crate::switch::{Fabric, MacEntry, Router, Wire};
use crate::sys::{pin_current_thread, Epoll, Timer};
use pvnet_net::QueueIndex;
use pvnet_vhost::backend::StartedQueue;
use pvnet_vhost::Notifier;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};
use virtq::Armed;
use virtq::MemTable;
use vmm_sys_util::epoll::EpollEvent;

/// What the control plane asks of a shard.
pub(crate) enum Cmd {
    AddPort(PortId),
    Start(PortId, Box<StartedQueue>),
    Stop(PortId, u16, SyncSender<Option<u16>>),
    /// A new memory table or IOTLB snapshot; the flag (if given) is set once every ring
    /// switched.
    Mem(PortId, Arc<MemTable>, Option<Arc<AtomicBool>>),
    RemovePort(PortId, SyncSender<()>),
    /// A port deleted from the switch: removed, and its settings forgotten.
    Forget(PortId, SyncSender<()>),
    /// A host port, or lane `k` of one spread over shards (0 for one that is not).
    AddHost(PortId, usize, Box<HostPort>),
    /// Port `id` has lanes on the shards of the mask (0: it has none any more). Every shard
    /// is sent it: the fabric's rules for what comes over a trunk depend on it.
    Lanes(PortId, u64),
    Egress(PortId, EgressConfig),
    /// A port's own polling policy of its transmit rings (None: the shard's).
    Policy(PortId, Option<Policy>),
    Macs(SyncSender<Vec<MacEntry>>),
    /// This shard's end of the trunk to shard `peer` (the learning switch on several shards).
    Trunk(Box<TrunkEnd>),
    /// A guest's address is behind this port now (SEND_RARP after a migration).
    Learn(PortId, [u8; 6]),
    /// A port's VLAN settings (None: none). Every shard is sent them (a port may move).
    Vlan(PortId, Option<VlanMode>),
    /// Stop switching until told to go on (a port moves between two other shards: see
    /// `Dataplane::move_port`): answers once at a round boundary, then waits.
    Pause(SyncSender<()>, Receiver<Resume>),
    /// A vhost-user port leaves this shard for shard `to` (every other shard is paused):
    /// what the others had sent here is switched first, then the port, its settings and the
    /// addresses learned on it are handed over; None if it is not here (not connected).
    Detach(PortId, usize, SyncSender<Option<Box<Moving>>>),
    Shutdown,
}

/// What a shard shares with the control plane.
pub(crate) struct Link {
    /// Commands.
    pub(crate) rx: Receiver<Cmd>,
    /// "Look at the channel".
    pub(crate) pending: Arc<AtomicBool>,
    /// Set while it sleeps.
    pub(crate) asleep: Arc<AtomicBool>,
    /// Wakes it.
    pub(crate) wake_fd: Notifier,
    /// Its busy and total time.
    pub(crate) load: Arc<Load>,
}

/// A learned address and its VLAN.
pub(crate) type VlanMac = (u16, [u8; 6]);

/// A port on its way between two shards.
pub(crate) struct Moving {
    pub(crate) port: AnyPort,
    pub(crate) egress: Option<EgressConfig>,
    pub(crate) policy: Option<Policy>,
    /// The addresses learned on it, each with its VLAN.
    pub(crate) macs: Vec<VlanMac>,
}

/// What a paused shard does before it goes on.
#[derive(Default)]
pub(crate) struct Resume {
    /// A port moving in (its new shard's).
    pub(crate) attach: Option<Box<Moving>>,
    /// These addresses are behind this port now (the moved port, or the trunk to its new
    /// shard).
    pub(crate) learn: Option<(PortId, Vec<VlanMac>)>,
    /// The trunk from the port's old shard: what is in it is switched before anything else,
    /// so nothing the moved port sent from there is overtaken by what it sends now.
    pub(crate) drain: Option<PortId>,
}

/// A shard's time, split by whether its rounds moved packets (written by the shard, read
/// by the control plane for placement and rebalancing).
#[derive(Debug, Default)]
pub(crate) struct Load {
    /// Nanoseconds of rounds that moved at least one packet, since the shard started.
    pub(crate) busy_ns: std::sync::atomic::AtomicU64,
    /// Nanoseconds since the shard started (asleep included).
    pub(crate) total_ns: std::sync::atomic::AtomicU64,
}

const WAKE_TOKEN: u64 = u64::MAX;
const TIMER_TOKEN: u64 = u64::MAX - 1;
/// Queue index in the epoll token of a host port's fd (a tap).
const HOST_QUEUE: u16 = u16::MAX;
/// Ids of the ports a bench role puts behind a frontend's port: the frontend's id with a
/// high bit set (frontends are numbered from 0 in connection order).
const BEHIND_SINK: PortId = 1 << 31;
const BEHIND_GEN: PortId = 1 << 30;
/// Any of the ids that are not a user's port (behind a frontend, a trunk).
pub(crate) const BEHIND: PortId = BEHIND_SINK | BEHIND_GEN | TRUNK;
/// Id of shard `s`'s trunk to shard `k`: `TRUNK | s << 12 | k`.
pub(crate) const TRUNK: PortId = 1 << 29;

/// The id of shard `from`'s trunk to shard `to`.
pub(crate) fn trunk_id(from: usize, to: usize) -> PortId {
    let f = PortId::try_from(from & 0xfff).unwrap_or(0);
    let t = PortId::try_from(to & 0xfff).unwrap_or(0);
    TRUNK | f << 12 | t
}

/// The shard a trunk id belongs to (`from` in [`trunk_id`]); None for any other port.
pub(crate) fn trunk_owner(id: PortId) -> Option<usize> {
    (id & TRUNK != 0).then_some(((id >> 12) & 0xfff) as usize)
}

/// What a shard needs to make its end of a trunk.
pub(crate) struct TrunkEnd {
    pub(crate) peer: usize,
    pub(crate) ring: (trunk::Producer, trunk::Consumer),
    pub(crate) peer_wake: Notifier,
    pub(crate) peer_asleep: Arc<AtomicBool>,
}
/// Most frames a bench-role generator's frame may be (its frontend's buffers bound it).
const BENCH_MAX_FRAME: usize = 65536;

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn token(port: PortId, index: u16) -> u64 {
    (u64::from(port) << 16) | u64::from(index)
}

/// One shard's state.
pub(crate) struct Shard {
    index: usize,
    cfg: WorkerConfig,
    rx: Receiver<Cmd>,
    pending: Arc<AtomicBool>,
    /// Set while the shard sleeps (touching no ring): a new memory table or IOTLB snapshot
    /// then needs neither a wake-up nor a wait, since the shard applies pending commands
    /// when it wakes, before it touches a ring again (see `Dataplane::set_mem`).
    asleep: Arc<AtomicBool>,
    wake_fd: Notifier,
    registry: Arc<Mutex<Registry>>,
    ports: Vec<AnyPort>,
    fabric: Fabric,
    epoll: Epoll,
    timer: Timer,
    quit: bool,
    /// Last seen SIGBUS-guard generation (see `pvnet_vhost::fault_generation`).
    faults: u64,
    /// Measured sleep/wake cost (bounds the adaptive window and call coalescing).
    wake: WakeCost,
    /// Egress settings of ports that have their own (others: `cfg.egress`).
    egress: std::collections::BTreeMap<PortId, EgressConfig>,
    /// Transmit-ring policies of ports that have their own (others: `cfg.policy`).
    policy: std::collections::BTreeMap<PortId, Policy>,
    /// Busy and total time, published each round.
    load: Arc<Load>,
}

impl Shard {
    pub(crate) fn new(
        index: usize,
        cfg: WorkerConfig,
        link: Link,
        registry: Arc<Mutex<Registry>>,
    ) -> std::io::Result<Self> {
        let Link {
            rx,
            pending,
            asleep,
            wake_fd,
            load,
        } = link;
        let epoll = Epoll::new()?;
        epoll.add(wake_fd.as_raw_fd(), WAKE_TOKEN);
        let timer = Timer::new()?;
        epoll.add(timer.fd(), TIMER_TOKEN);
        let router = match cfg.role {
            Role::Switch(sc) => Router::learning(sc),
            _ => Router::Fixed(Vec::new()),
        };
        Ok(Self {
            index,
            cfg,
            rx,
            pending,
            asleep,
            wake_fd,
            registry,
            ports: Vec::new(),
            fabric: Fabric::new(router, cfg.batch),
            epoll,
            timer,
            quit: false,
            faults: 0,
            wake: WakeCost::FALLBACK,
            egress: std::collections::BTreeMap::new(),
            policy: std::collections::BTreeMap::new(),
            load,
        })
    }

    /// Pins the thread, then measures the wake-up cost here, as the shard will actually be
    /// woken (before any frontend can connect: the caller waits).
    pub(crate) fn pin_and_measure(&mut self, cpu: Option<usize>) {
        if let Some(cpu) = cpu {
            if !pin_current_thread(cpu) {
                warn!(cpu, shard = self.index, "could not pin the shard");
            }
        }
        self.wake = WakeCost::measure(50);
    }

    fn vhost_config(&self, id: PortId) -> VhostConfig {
        VhostConfig {
            tx_policy: self.policy.get(&id).copied().unwrap_or(self.cfg.policy),
            rx_policy: self.cfg.rx_policy,
            batch: usize::from(self.cfg.batch.max(1)),
            call_bound: call_bound(self.cfg.tx_call_delay, self.wake.typical),
            egress: match self.cfg.role {
                Role::Switch(_) => EgressConfig {
                    hold: HoldPolicy::Bounded(HOLD),
                    ..self.egress.get(&id).copied().unwrap_or(self.cfg.egress)
                },
                _ => EgressConfig::hold(HoldPolicy::Forever),
            },
            wake: self.wake,
        }
    }

    fn index_of(&self, id: PortId) -> Option<usize> {
        self.ports.iter().position(|p| p.id() == id)
    }

    fn vhost(&mut self, id: PortId) -> Option<&mut VhostPort> {
        let i = self.index_of(id)?;
        self.ports[i].as_vhost()
    }

    fn add(&mut self, p: AnyPort) {
        self.ports.push(p);
        self.ports
            .sort_by_key(|p| p.id() & !(BEHIND_SINK | BEHIND_GEN));
    }

    fn wire(&mut self, from: PortId, to: Wire) {
        if let Router::Fixed(w) = self.fabric.router_mut() {
            w.retain(|&(s, _)| s != from);
            w.push((from, to));
        }
    }

    /// A frontend connected: its port, and what a bench role puts behind it.
    fn add_vhost(&mut self, id: PortId) {
        // A port keeps its counters across reconnections.
        let stats = self.pair_stats(id, 0);
        stats[0].up.store(1, Ordering::Relaxed);
        info!(shard = self.index, port = id, "frontend port placed");
        let first = stats[0].clone();
        self.add(AnyPort::Vhost(VhostPort::new(
            id,
            self.vhost_config(id),
            stats,
        )));
        match self.cfg.role {
            Role::Switch(_) => {}
            Role::Sink => self.add_behind_sink(id, first),
            Role::Gen(g) => {
                self.add_behind_sink(id, first.clone());
                self.add_behind_gen(id, first, g);
            }
            Role::Forward => self.wire(id, Wire::To(id ^ 1)),
            Role::Echo => self.wire(id, Wire::Hairpin),
        }
    }

    fn add_behind_sink(&mut self, id: PortId, stats: Arc<PortStats>) {
        let sink = id | BEHIND_SINK;
        self.add(AnyPort::Sink(SinkPort::new(
            sink,
            stats,
            Counting::Behind,
            BENCH_MAX_FRAME,
        )));
        self.wire(id, Wire::To(sink));
    }

    fn add_behind_gen(&mut self, id: PortId, stats: Arc<PortStats>, g: GenConfig) {
        let gen = id | BEHIND_GEN;
        let spec = GenSpec {
            frame_len: g.frame_len,
            rate: 0,
            duration: Some(g.duration),
            delay: Duration::ZERO,
            src: [2, 0, 0, 0, 0, 1],
            dst: [2, 0, 0, 0, 0, 2],
            flows: 1,
        };
        self.add(AnyPort::Gen(GenPort::new(
            gen,
            stats,
            spec,
            Counting::Behind,
        )));
        self.wire(gen, Wire::To(id));
    }

    /// Host port `id`, or its lane `lane` (its own counters: the port's `lane`-th block).
    fn add_host(&mut self, id: PortId, lane: usize, h: HostPort) {
        if !matches!(self.cfg.role, Role::Switch(_)) {
            warn!(port = id, "host ports need the switch role");
            return;
        }
        let stats = self.pair_stats(id, lane).swap_remove(lane);
        stats.up.store(1, Ordering::Relaxed);
        info!(
            port = id,
            kind = h.kind_name(),
            shard = self.index,
            lane,
            "host port added"
        );
        let port = match h {
            HostPort::Kernel(dev, io, direct) => {
                let mut p = KernelPort::new(id, stats, dev, io, direct);
                if let Some(&e) = self.egress.get(&id) {
                    p.set_egress(e);
                }
                for fd in p.fds() {
                    self.epoll.add(fd, token(id, HOST_QUEUE));
                }
                AnyPort::Kernel(p)
            }
            HostPort::AfXdp(dev) => {
                let mut p = crate::port::afxdp::AfXdpPort::new(id, stats, dev);
                if let Some(&e) = self.egress.get(&id) {
                    p.set_egress(e);
                }
                for fd in p.fds() {
                    self.epoll.add(fd, token(id, HOST_QUEUE));
                }
                AnyPort::AfXdp(p)
            }
            HostPort::Vxlan(u) => {
                let aging = match self.cfg.role {
                    Role::Switch(sw) => sw.aging,
                    _ => crate::switch::SwitchConfig::default().aging,
                };
                let p = crate::port::vxlan::VxlanPort::new(id, stats, u, aging);
                self.epoll.add(p.fd(), token(id, HOST_QUEUE));
                AnyPort::Vxlan(p)
            }
            HostPort::Sink => AnyPort::Sink(SinkPort::new(
                id,
                stats,
                Counting::Own,
                crate::sys::tap::RECV_BUF_LEN,
            )),
            HostPort::Gen(spec) => AnyPort::Gen(GenPort::new(id, stats, spec, Counting::Own)),
        };
        self.add(port);
    }

    /// Calls in the loans of `lender`'s receive buffers a port of this shard holds (direct
    /// receive, [`crate::port::loan`]; every loan of every lender if None) and gives them
    /// back to their lenders: before a lender's ring starts or stops or its memory changes,
    /// before it goes, and before the holder goes. The holder's sockets are closed first, so
    /// nothing writes into a buffer after its frontend has it back.
    fn call_in_loans(&mut self, lender: Option<PortId>, holder: Option<PortId>) {
        let mut back = Vec::new();
        for p in &mut self.ports {
            if let AnyPort::AfXdp(x) = p {
                if holder.is_none_or(|h| h == x.id()) {
                    back.extend(x.call_in(lender));
                }
            }
        }
        for p in &mut self.ports {
            let id = p.id();
            let mine: Vec<_> = back.iter().filter(|l| l.lender == id).copied().collect();
            if !mine.is_empty() {
                p.unloan(&mine);
            }
        }
    }

    fn remove(&mut self, id: PortId) {
        self.call_in_loans(Some(id), None);
        self.call_in_loans(None, Some(id));
        self.stop_queues(id);
        for pid in [id, id | BEHIND_SINK, id | BEHIND_GEN] {
            if let Some(i) = self.index_of(pid) {
                let p = self.ports.remove(i);
                // (a lane's own counters: the port's others are its other lanes')
                p.tx_stats().up.store(0, Ordering::Relaxed);
                if let AnyPort::Kernel(t) = &p {
                    for fd in t.fds() {
                        self.epoll.remove(fd);
                    }
                }
                if let AnyPort::AfXdp(x) = &p {
                    for fd in x.fds() {
                        self.epoll.remove(fd);
                    }
                }
                if let AnyPort::Vxlan(x) = &p {
                    self.epoll.remove(x.fd());
                }
            }
            self.fabric.port_down(pid);
        }
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(qps) = r.get(&id) {
            qps[0].up.store(0, Ordering::Relaxed);
            info!(port = id, stats = ?crate::stats::PortSnapshot::sum(id, qps.iter().map(|s| &**s)), "port removed");
        }
    }

    fn stop_queues(&mut self, id: PortId) {
        let pairs = self.vhost(id).map_or(0, |p| p.pairs());
        for q in QueueIndex::all(pairs) {
            self.stop_queue(id, q.0);
        }
    }

    /// The counters of pairs `0..=pair` of port `id` (a port keeps them across reconnections:
    /// they are created the first time a queue of that pair starts).
    fn pair_stats(&self, id: PortId, pair: usize) -> Vec<Arc<PortStats>> {
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let v = r.entry(id).or_default();
        while v.len() <= pair {
            v.push(Arc::default());
        }
        v.clone()
    }

    fn stop_queue(&mut self, id: PortId, index: u16) -> Option<u16> {
        self.call_in_loans(Some(id), None);
        let (base, fd) = self.vhost(id)?.stop(index)?;
        if let Some(fd) = fd {
            self.epoll.remove(fd);
        }
        Some(base)
    }

    fn commands(&mut self, now: Instant) {
        while let Ok(c) = self.rx.try_recv() {
            match c {
                Cmd::AddPort(id) => self.add_vhost(id),
                Cmd::Start(id, q) => self.start_queue(id, *q),
                Cmd::Stop(id, index, reply) => {
                    if QueueIndex(index).is_tx() {
                        self.drain(id, now);
                    }
                    let _ = reply.send(self.stop_queue(id, index));
                }
                Cmd::Mem(id, mem, reply) => {
                    self.call_in_loans(Some(id), None);
                    if let Some(p) = self.vhost(id) {
                        p.set_mem(&mem);
                    }
                    if let Some(done) = reply {
                        done.store(true, Ordering::Release);
                    }
                }
                Cmd::RemovePort(id, reply) => {
                    self.remove(id);
                    let _ = reply.send(());
                }
                Cmd::AddHost(id, lane, h) => self.add_host(id, lane, *h),
                Cmd::Lanes(id, mask) => self.set_lanes(id, mask),
                Cmd::Forget(id, reply) => {
                    self.remove(id);
                    self.egress.remove(&id);
                    self.policy.remove(&id);
                    let _ = reply.send(());
                }
                Cmd::Egress(id, e) => self.set_egress(id, e),
                Cmd::Policy(id, policy) => self.set_policy(id, policy),
                Cmd::Vlan(id, mode) => self.fabric.set_vlan(id, mode),
                Cmd::Learn(id, mac) => {
                    // In the VLAN its frontend's frames are in untagged (none on a trunk
                    // without a native VLAN: it is learned from its frames).
                    let vlan = match self.fabric.vlan_of(id) {
                        None => Some(0),
                        Some(m) => m.untagged(),
                    };
                    if let Some(vlan) = vlan.filter(|&v| self.learn(id, &[(v, mac)], now)) {
                        info!(
                            port = id,
                            vlan,
                            ?mac,
                            "address relearned (announced after a migration)"
                        );
                    }
                }
                Cmd::Pause(ack, resume) => {
                    let _ = ack.send(());
                    match resume.recv_timeout(Duration::from_secs(10)) {
                        Ok(r) => self.resume(r),
                        Err(_) => warn!(shard = self.index, "paused 10 s without a resume"),
                    }
                }
                Cmd::Detach(id, to, reply) => {
                    let _ = reply.send(self.detach(id, to));
                }
                Cmd::Macs(reply) => {
                    let _ = reply.send(self.fabric.macs(now));
                }
                Cmd::Trunk(t) => self.add_trunk(*t),
                Cmd::Shutdown => self.quit = true,
            }
        }
    }

    /// A started queue of port `id`: its kick joins the epoll set, and its pair gets its
    /// counters if it is the port's first queue of that pair.
    fn start_queue(&mut self, id: PortId, q: StartedQueue) {
        self.call_in_loans(Some(id), None);
        if let Some(fd) = q.kick.as_ref().map(AsRawFd::as_raw_fd) {
            self.epoll.add(fd, token(id, q.index));
        }
        let pair = QueueIndex(q.index).pair();
        let new_pair = self
            .vhost(id)
            .is_some_and(|p| usize::from(p.pairs()) <= pair);
        let stats = new_pair.then(|| self.pair_stats(id, pair));
        match self.vhost(id) {
            Some(p) => {
                if let Some(stats) = stats {
                    p.add_pairs(stats);
                }
                p.start(q);
            }
            None => warn!(port = id, "queue for unknown port"),
        }
    }

    /// Port `id`'s egress queue settings: kept for its next connection, applied now if it is
    /// here.
    fn set_egress(&mut self, id: PortId, e: EgressConfig) {
        self.egress.insert(id, e);
        let cfg = self.vhost_config(id).egress;
        match self.index_of(id).map(|i| &mut self.ports[i]) {
            Some(AnyPort::Vhost(p)) => p.set_egress(cfg),
            Some(AnyPort::Kernel(p)) => p.set_egress(e),
            Some(AnyPort::AfXdp(p)) => p.set_egress(e),
            _ => {}
        }
    }

    /// Port `id`'s own polling policy of its transmit rings (None: the shard's).
    fn set_policy(&mut self, id: PortId, policy: Option<Policy>) {
        match policy {
            Some(p) => self.policy.insert(id, p),
            None => self.policy.remove(&id),
        };
        let p = self.vhost_config(id).tx_policy;
        if let Some(v) = self.vhost(id) {
            v.set_tx_policy(p);
        }
    }

    /// Port `id` has lanes on the shards of `mask` (0: none): the fabric's rules, and the
    /// trunks cut their bursts by origin while any port is spread.
    fn set_lanes(&mut self, id: PortId, mask: u64) {
        self.fabric.set_lanes(id, mask);
        let spread = self.fabric.spread();
        for p in &mut self.ports {
            if let AnyPort::Trunk(t) = p {
                t.set_by_origin(spread);
            }
        }
    }

    /// This shard's end of the trunk to shard `t.peer`, a port of its own.
    fn add_trunk(&mut self, t: TrunkEnd) {
        let id = trunk_id(self.index, t.peer);
        let stats = self.pair_stats(id, 0).swap_remove(0);
        stats.up.store(1, Ordering::Relaxed);
        info!(shard = self.index, peer = t.peer, "trunk to shard up");
        let mut end = TrunkPort::new(
            (id, t.peer),
            stats,
            t.ring,
            t.peer_wake,
            t.peer_asleep,
            self.wake,
        );
        end.set_by_origin(self.fabric.spread());
        self.add(AnyPort::Trunk(end));
    }

    /// Hands a vhost-user port over for shard `to`, between rounds (every batch of it is
    /// committed), while every other shard is paused. First what those shards had sent here
    /// is switched (what was on its way to the port reaches it, or its egress queue, which
    /// travels with it). Then its rings are disarmed (the new shard polls first) and leave
    /// the epoll set, and its addresses are known here as behind the trunk to `to`.
    fn detach(&mut self, id: PortId, to: usize) -> Option<Box<Moving>> {
        let i = self.index_of(id)?;
        for k in 0..self.ports.len() {
            if self.ports[k].is_trunk() {
                self.drain_trunk(k); // switches, never adds or removes a port: `i` holds
            }
        }
        let AnyPort::Vhost(v) = &mut self.ports[i] else {
            return None;
        };
        v.disarm(false);
        for (_, fd) in v.kick_fds() {
            self.epoll.remove(fd);
        }
        let port = self.ports.remove(i);
        let now = Instant::now();
        let macs: Vec<(u16, [u8; 6])> = self
            .fabric
            .macs(now)
            .into_iter()
            .filter(|e| e.port == id)
            .map(|e| (e.vlan, e.mac))
            .collect();
        self.fabric.port_down(id);
        self.learn(trunk_id(self.index, to), &macs, now);
        info!(shard = self.index, port = id, to, "port leaves the shard");
        Some(Box::new(Moving {
            port,
            egress: self.egress.remove(&id),
            policy: self.policy.remove(&id),
            macs,
        }))
    }

    /// Goes on after a pause: takes in a moved port, learns where its addresses are now, and
    /// switches what waits in the trunk from its old shard before anything else.
    fn resume(&mut self, r: Resume) {
        let now = Instant::now();
        if let Some(m) = r.attach {
            let mut port = m.port;
            let id = port.id();
            if let Some(v) = port.as_vhost() {
                for (index, fd) in v.kick_fds() {
                    self.epoll.add(fd, token(id, index));
                }
            }
            if let Some(e) = m.egress {
                self.egress.insert(id, e);
            }
            if let Some(p) = m.policy {
                self.policy.insert(id, p);
            }
            self.add(port);
            info!(
                shard = self.index,
                port = id,
                "port placed on the shard (moved)"
            );
        }
        if let Some((at, macs)) = r.learn {
            self.learn(at, &macs, now);
        }
        if let Some(k) = r.drain.and_then(|t| self.index_of(t)) {
            self.drain_trunk(k);
        }
    }

    /// These addresses are behind port `at` now. False under a fixed wiring (nothing learns).
    fn learn(&mut self, at: PortId, macs: &[(u16, [u8; 6])], now: Instant) -> bool {
        let Router::Learn(t) = self.fabric.router_mut() else {
            return false;
        };
        for &(vlan, mac) in macs {
            t.learn(vlan, mac, at, now);
        }
        true
    }

    /// Switches what waits in trunk `k` (the port at that index), and only that, until it is
    /// empty: at most 10 ms (a receiver that stays full makes its packets wait or drop, as
    /// in a round).
    fn drain_trunk(&mut self, k: usize) {
        let until = Instant::now() + Duration::from_millis(10);
        loop {
            let pending = matches!(&self.ports[k], AnyPort::Trunk(t) if t.pending());
            let now = Instant::now();
            if !pending || now > until {
                return;
            }
            self.fabric.burst(&mut self.ports, k, now);
        }
    }

    /// A peer shrank memory it shared and an access faulted: stop every queue whose memory
    /// table holds a faulted mapping. Everything else goes on.
    fn check_faults(&mut self) {
        let g = pvnet_vhost::fault_generation();
        if g == self.faults {
            return;
        }
        self.faults = g;
        for p in &mut self.ports {
            if let Some(v) = p.as_vhost() {
                v.check_faults();
            }
        }
    }

    /// Runs rounds until nothing moves (at most one ring's worth): a frontend that stops its
    /// transmit ring (GET_VRING_BASE) has every packet it made available before the stop
    /// taken, even when the shard was off its CPU when the frontend stopped sending.
    fn drain(&mut self, id: PortId, now: Instant) {
        let size = self.vhost(id).map_or(0, |v| v.tx_ring_size());
        let rounds = usize::from(size / self.cfg.batch.max(1)) + 1;
        for _ in 0..rounds {
            if self.fabric.round(&mut self.ports, now) == 0 {
                break;
            }
        }
    }

    /// After a round: what every port wants, and, if all may sleep, arm them (arm, fence,
    /// re-check). `None`: poll on (a port wants it, or work arrived while arming).
    fn settle(&mut self, now: Instant) -> Option<Option<Instant>> {
        let mut settle = Settle::new();
        for p in &mut self.ports {
            p.idle(now, &mut settle);
            if let AnyPort::AfXdp(x) = p {
                // Sockets rebuilt (direct receive): the new ones wake the shard too. (The
                // old ones left the set when they closed.)
                if x.take_rebuilt() {
                    for fd in x.fds() {
                        self.epoll.add(fd, token(x.id(), HOST_QUEUE));
                    }
                }
            }
        }
        let Plan::Sleep(deadline) = settle.plan() else {
            return None;
        };
        let mut armed = Armed::Empty;
        for p in &mut self.ports {
            if p.arm() == Armed::NotEmpty {
                armed = Armed::NotEmpty;
            }
        }
        if armed == Armed::NotEmpty || self.pending.load(Ordering::Acquire) {
            self.disarm(false);
            return None;
        }
        Some(deadline)
    }

    fn disarm(&mut self, slept: bool) {
        for p in &mut self.ports {
            p.disarm(slept);
        }
    }

    fn sleep(&mut self, deadline: Option<Instant>, now: Instant) {
        for p in &mut self.ports {
            if let Some(v) = p.as_vhost() {
                v.count_sleep();
            }
        }
        let timed = deadline.map(|t| {
            t.saturating_duration_since(now)
                .max(Duration::from_micros(1))
        });
        if let Some(d) = timed {
            self.timer.set(d);
        }
        // Asleep from here: SeqCst store, then the pending check (the control plane stores
        // pending, then reads asleep): one of the two sees the other's store.
        self.asleep.store(true, Ordering::SeqCst);
        // (a trunk's sender publishes, then reads `asleep`: one of the two sees the other)
        let handed = self
            .ports
            .iter()
            .any(|p| matches!(p, AnyPort::Trunk(t) if t.pending()));
        if self.pending.load(Ordering::SeqCst) || handed {
            self.asleep.store(false, Ordering::SeqCst);
            if timed.is_some() {
                self.timer.clear();
            }
            return;
        }
        // Deadlines come from the timerfd: epoll itself waits without a timeout.
        let mut evs = [EpollEvent::default(); 16];
        let n = self.epoll.wait(-1, &mut evs);
        self.asleep.store(false, Ordering::SeqCst);
        if timed.is_some() {
            self.timer.clear();
        }
        for ev in &evs[..n] {
            let tok = ev.data();
            if tok == WAKE_TOKEN {
                self.wake_fd.drain();
                continue;
            }
            if tok == TIMER_TOKEN {
                self.timer.clear();
                continue;
            }
            let (port, index) = (
                PortId::try_from(tok >> 16).unwrap_or(PortId::MAX),
                (tok & 0xffff) as u16,
            );
            if let Some(i) = self.index_of(port) {
                self.ports[i].event(index);
            }
        }
    }

    pub(crate) fn run(&mut self, clock: &impl Clock) {
        info!(
            shard = self.index, role = ?self.cfg.role, policy = %self.cfg.policy, rx_policy = %self.cfg.rx_policy,
            wake_us = self.wake.typical.as_secs_f64() * 1e6, wake_floor_us = self.wake.floor.as_secs_f64() * 1e6, batch = self.cfg.batch, "shard running"
        );
        let (start, mut last, mut busy, mut worked) = (clock.now(), clock.now(), 0u64, false);
        while !self.quit {
            // Acquire: pairs with the release in `Dataplane::send`; the command is visible.
            if self.pending.load(Ordering::Relaxed) && self.pending.swap(false, Ordering::Acquire) {
                self.commands(clock.now());
                continue;
            }
            // One clock read per round (per batch of every queue), not per packet.
            let now = clock.now();
            // The time since the last round's start was busy if that round moved packets
            // (two relaxed stores a round to a line only this thread writes).
            if worked {
                busy += duration_ns(now.saturating_duration_since(last));
                self.load.busy_ns.store(busy, Ordering::Relaxed);
            }
            self.load.total_ns.store(
                duration_ns(now.saturating_duration_since(start)),
                Ordering::Relaxed,
            );
            last = now;
            worked = self.fabric.round(&mut self.ports, now) > 0;
            self.check_faults();
            let Some(deadline) = self.settle(now) else {
                std::hint::spin_loop();
                continue;
            };
            self.sleep(deadline, now);
            // Commands that came while asleep (a revocation acked without waiting for us)
            // apply before any ring is touched again.
            if self.pending.load(Ordering::SeqCst) && self.pending.swap(false, Ordering::Acquire) {
                self.commands(clock.now());
            }
            self.disarm(true);
        }
        info!(shard = self.index, "shard stopped");
    }
}
