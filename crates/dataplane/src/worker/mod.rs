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
//! Placement: a port lives on one shard, chosen from its id ([`Dataplane::shard_of`]): ports
//! are dealt round-robin over the shards (the bench role `forward` keeps a forwarding pair
//! together). Under the learning switch, every pair of shards is joined by a trunk
//! ([`crate::port::trunk`]): each shard switches among its own ports and sends what is for
//! another shard's ports over that shard's trunk (a copy into a ring, then the usual copy
//! into the receiver). There is no rebalancing: a port stays where it was placed. One shard
//! by default.

pub mod shard;

use crate::poll::Policy;
use crate::port::gen::GenSpec;
use crate::port::PortId;
use crate::stats::{PortSnapshot, PortStats};
use crate::switch::{MacEntry, SwitchConfig};
use pvnet_vhost::backend::{DeviceHooks, StartedQueue};
use pvnet_vhost::eventfd::Notifier;
use shard::{Cmd, Shard};
use std::collections::BTreeMap;
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
    /// Consumes and checks.
    Sink,
    /// Produces.
    Gen(GenSpec),
}

impl HostPort {
    /// "tap", "sink" or "gen".
    pub fn kind_name(&self) -> &'static str {
        match self {
            HostPort::Kernel(crate::port::kernel::HostDev::Tap(_), _, _) => "tap",
            HostPort::Kernel(crate::port::kernel::HostDev::Packet(_), _, _) => "af-packet",
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
}

/// Handle to the shards; the control plane's [`DeviceHooks`].
pub struct Dataplane {
    cfg: WorkerConfig,
    shards: Vec<ShardHandle>,
    registry: Arc<Mutex<Registry>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
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
        for index in 0..n {
            let (tx, rx) = channel();
            let pending = Arc::new(AtomicBool::new(false));
            let asleep = Arc::new(AtomicBool::new(false));
            let wake = Notifier::new()?;
            let tid = Arc::new(std::sync::atomic::AtomicI32::new(0));
            let tid2 = tid.clone();
            let mut s = Shard::new(
                index,
                cfg,
                rx,
                pending.clone(),
                asleep.clone(),
                wake.try_clone()?,
                registry.clone(),
            )?;
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
        });
        if matches!(cfg.role, Role::Switch(_)) && n > 1 {
            dp.join_shards()?;
        }
        Ok(dp)
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

    /// Each worker: its CPU, thread, ports and traffic over its trunks.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut w: Vec<WorkerInfo> = self
            .shards
            .iter()
            .enumerate()
            .map(|(k, s)| WorkerInfo {
                index: k,
                cpu: self.cfg.cpu.map(|c| (c + k) % crate::sys::online_cpus()),
                tid: s.tid.load(Ordering::Relaxed),
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
            } else if id & shard::BEHIND == 0 {
                w[self.shard_of(id)].ports.push(id);
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

    /// The shard a port lives on (see the module docs).
    pub fn shard_of(&self, port: PortId) -> usize {
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

    fn send_port(&self, port: PortId, c: Cmd) {
        self.send(self.shard_of(port), c);
    }

    /// Snapshots of every port ever connected, current or gone, each summed over its queue
    /// pairs.
    pub fn snapshots(&self) -> Vec<PortSnapshot> {
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.iter()
            .map(|(&id, qps)| PortSnapshot::sum(id, qps.iter().map(|s| &**s)))
            .collect()
    }

    /// Adds a tap, sink or gen port to the switch (its id must not be used by another port).
    pub fn add_host(&self, id: PortId, port: HostPort) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_insert_with(|| vec![Arc::default()]);
        self.send_port(id, Cmd::AddHost(id, Box::new(port)));
    }

    /// Gives a switch port its own egress settings (a port without them takes
    /// [`WorkerConfig::egress`]). A connected port switches at once: what waited in its old
    /// queue is dropped, counted as `reconfigured`.
    pub fn set_egress(&self, id: PortId, e: crate::egress::EgressConfig) {
        self.send_port(id, Cmd::Egress(id, e));
    }

    /// Deletes a port from the switch: its queues stop (what waited in its egress queue is
    /// counted as dropped, `port_down`), its frames stop being switched, and its settings and
    /// counters are forgotten. Returns its last counters. (A vhost-user port's frontend must
    /// already be disconnected, or it reconnects into a port that no longer exists.)
    pub fn remove_port(&self, id: PortId) -> Option<PortSnapshot> {
        let (tx, rx) = sync_channel(1);
        self.send_port(id, Cmd::Forget(id, tx));
        let _ = rx.recv_timeout(Duration::from_secs(5));
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.remove(&id)
            .map(|qps| PortSnapshot::sum(id, qps.iter().map(|s| &**s)))
    }

    /// The switch's learned addresses, every shard's (what a shard learned behind a trunk
    /// is another shard's entry: left out). Empty for other roles.
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
        all
    }

    /// Stops every shard and waits for them.
    pub fn shutdown(&self) {
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
        let Some(s) = self.shards.get(self.shard_of(port)) else {
            return;
        };
        let done = Arc::new(AtomicBool::new(false));
        if s.tx
            .send(Cmd::Mem(port, mem, wait.then(|| done.clone())))
            .is_err()
        {
            return;
        }
        // SeqCst store then SeqCst load, against the shard's store of `asleep` then load of
        // `pending` (`Shard::sleep`): at least one side sees the other.
        s.pending.store(true, Ordering::SeqCst);
        if wait && !s.asleep.load(Ordering::SeqCst) {
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
