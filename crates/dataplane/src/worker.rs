//! The worker thread: owns every running ring, polls them, sleeps only after arming.
//!
//! Control-plane threads talk to it through [`Dataplane`], which implements
//! [`DeviceHooks`]: commands go down a channel, a flag says "look at the channel" (checked
//! once per loop round, one relaxed load) and an eventfd wakes the worker if it sleeps.
//! `stop_queue` and `port_gone` wait for the worker's answer, so when they return the ring
//! is no longer touched and the memory may be unmapped.

use crate::poll::{Clock, Idle, MonoClock, Policy, WakeCost};
use crate::port::{forward, Port, QueueSlot, Role};
use crate::stats::{bump, PortSnapshot, PortStats};
use crate::switch::{Fabric, HostPort, MacEntry};
use pvnet_vhost::backend::{DeviceHooks, PortId, StartedQueue};
use pvnet_vhost::eventfd::Notifier;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use tracing::{debug, info, warn};
use virtq::event::Armed;
use virtq::MemTable;

/// Worker settings.
#[derive(Debug, Clone, Copy)]
pub struct WorkerConfig {
    /// What ports do with packets.
    pub role: Role,
    /// Polling/notification policy of the queues the frontend fills (its transmit queues).
    pub policy: Policy,
    /// Policy of the receive queues, while the worker waits for the frontend's buffers.
    pub rx_policy: Policy,
    /// Most chains per ring per round.
    pub batch: u16,
    /// CPU to pin the worker to.
    pub cpu: Option<usize>,
    /// How long a transmit-completion call may be held back (interrupt coalescing, like a
    /// NIC's tx-usecs): calls the driver asked for while this passes go out as one. Never less
    /// than two wake-ups.
    pub tx_call_delay: std::time::Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            role: Role::Sink,
            policy: Policy::Adaptive,
            rx_policy: Policy::Adaptive,
            batch: 64,
            cpu: None,
            tx_call_delay: std::time::Duration::from_micros(150),
        }
    }
}

enum Cmd {
    AddPort(PortId),
    Start(PortId, StartedQueue),
    Stop(PortId, u16, SyncSender<Option<u16>>),
    Mem(PortId, Arc<MemTable>),
    RemovePort(PortId, SyncSender<()>),
    AddHost(Box<HostPort>),
    Macs(SyncSender<Vec<MacEntry>>),
    Shutdown,
}

/// Handle to the worker; the control plane's [`DeviceHooks`].
pub struct Dataplane {
    tx: Sender<Cmd>,
    pending: Arc<AtomicBool>,
    wake: Notifier,
    registry: Arc<Mutex<BTreeMap<PortId, Arc<PortStats>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane").finish_non_exhaustive()
    }
}

impl Dataplane {
    /// Starts the worker thread.
    pub fn start(cfg: WorkerConfig) -> io::Result<Arc<Self>> {
        let (tx, rx) = channel();
        let pending = Arc::new(AtomicBool::new(false));
        let wake = Notifier::new()?;
        let registry = Arc::new(Mutex::new(BTreeMap::new()));
        let mut w = Worker::new(
            cfg,
            rx,
            pending.clone(),
            wake.try_clone()?,
            registry.clone(),
        )?;
        let (measured_tx, measured_rx) = sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("pvnet-worker".into())
            .spawn(move || {
                if let Some(cpu) = cfg.cpu {
                    if !pin_current_thread(cpu) {
                        warn!(cpu, "could not pin the worker");
                    }
                }
                // Measured here, pinned, as the worker will actually be woken; before any
                // frontend can connect (the caller waits), so nothing else disturbs it.
                w.wake = WakeCost::measure(50);
                let _ = measured_tx.send(());
                w.run(&MonoClock);
            })?;
        let _ = measured_rx.recv_timeout(std::time::Duration::from_secs(5));
        Ok(Arc::new(Self {
            tx,
            pending,
            wake,
            registry,
            thread: Mutex::new(Some(thread)),
        }))
    }

    fn send(&self, c: Cmd) {
        if self.tx.send(c).is_ok() {
            // Release: the command is in the channel before the worker sees the flag.
            self.pending.store(true, Ordering::Release);
            let _ = self.wake.signal();
        }
    }

    /// Snapshots of every port ever connected, current or gone.
    pub fn snapshots(&self) -> Vec<PortSnapshot> {
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.iter().map(|(&id, s)| s.snapshot(id)).collect()
    }

    /// Adds a tap, sink or gen port to a switch (its id must not be used by another port).
    pub fn add_host(&self, port: HostPort) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port.id, port.stats.clone());
        self.send(Cmd::AddHost(Box::new(port)));
    }

    /// The switch's learned addresses (empty for other roles, or if the worker is gone).
    pub fn macs(&self) -> Vec<MacEntry> {
        let (tx, rx) = sync_channel(1);
        self.send(Cmd::Macs(tx));
        rx.recv_timeout(std::time::Duration::from_secs(2))
            .unwrap_or_default()
    }

    /// Stops the worker and waits for it.
    pub fn shutdown(&self) {
        self.send(Cmd::Shutdown);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl DeviceHooks for Dataplane {
    fn port_connected(&self, port: PortId) {
        self.send(Cmd::AddPort(port));
    }
    fn start_queue(&self, port: PortId, q: StartedQueue) {
        self.send(Cmd::Start(port, q));
    }
    fn stop_queue(&self, port: PortId, index: u16) -> Option<u16> {
        let (tx, rx) = sync_channel(1);
        self.send(Cmd::Stop(port, index, tx));
        rx.recv().ok().flatten()
    }
    fn set_mem(&self, port: PortId, mem: Arc<MemTable>) {
        self.send(Cmd::Mem(port, mem));
    }
    fn port_gone(&self, port: PortId) {
        let (tx, rx) = sync_channel(1);
        self.send(Cmd::RemovePort(port, tx));
        let _ = rx.recv();
    }
}

/// Pin the calling thread to one CPU (`sched_setaffinity`). Returns false if it failed (e.g. a 1-CPU machine); never panics.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpu: usize) -> bool {
    let Ok(setsize) = usize::try_from(libc::CPU_SETSIZE) else {
        return false;
    };
    if cpu >= setsize {
        return false;
    }
    // SAFETY: cpu_set_t is a plain array of integers; all-zero bytes is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu < CPU_SETSIZE` (checked above), so CPU_SET stays inside `set`'s bit array.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 names the calling thread; `set` is an initialised cpu_set_t that lives
    // across the call and the size passed is exactly its size. The kernel only reads it.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    rc == 0
}

/// Pin the calling thread to one CPU (`sched_setaffinity`). Returns false if it failed (e.g. a 1-CPU machine); never panics.
///
/// Not supported on this OS: always returns false.
#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(cpu: usize) -> bool {
    let _ = cpu;
    false
}

const WAKE_TOKEN: u64 = u64::MAX;
const TIMER_TOKEN: u64 = u64::MAX - 1;
/// Queue index in the epoll token of a host port's fd (a tap).
const HOST_QUEUE: u16 = u16::MAX;

/// A one-shot monotonic timer in the epoll set: epoll's own timeout has millisecond
/// resolution, too coarse for `timer:<us>` periods.
struct Timer(std::os::fd::OwnedFd);

impl Timer {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; checked, then owned.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd owned by nobody else.
        Ok(Self(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    /// Fires once after `d` (zero disarms).
    fn set(&self, d: std::time::Duration) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(d.subsec_nanos()),
            },
        };
        // SAFETY: valid timerfd and itimerspec; failure only means a late wake.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads at most 8 bytes into a local from our non-blocking timerfd.
        unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

fn token(port: PortId, index: u16) -> u64 {
    (u64::from(port) << 16) | u64::from(index)
}

struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the fd is checked, then owned.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd owned by nobody else.
        Ok(Self(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    fn ctl(&self, op: libc::c_int, fd: i32, tok: u64) {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: tok,
        };
        // SAFETY: valid epoll fd and event struct; failure is only logged.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) };
        if r < 0 {
            debug!("epoll_ctl({op}, {fd}): {}", io::Error::last_os_error());
        }
    }

    fn wait(&self, evs: &mut [libc::epoll_event], timeout_ms: i32) -> usize {
        let max = i32::try_from(evs.len()).unwrap_or(i32::MAX);
        // SAFETY: `evs` is a valid writable buffer of `max` events.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), max, timeout_ms) };
        usize::try_from(n).unwrap_or(0)
    }
}

struct Worker {
    cfg: WorkerConfig,
    rx: Receiver<Cmd>,
    pending: Arc<AtomicBool>,
    wake_fd: Notifier,
    registry: Arc<Mutex<BTreeMap<PortId, Arc<PortStats>>>>,
    ports: Vec<Port>,
    epoll: Epoll,
    quit: bool,
    /// Last seen SIGBUS-guard generation (see `pvnet_vhost::fault`).
    faults: u64,
    /// Measured sleep/wake cost (bounds the adaptive window).
    wake: WakeCost,
    timer: Timer,
    /// The switch (role `Switch`): learned addresses and host ports.
    fabric: Option<Fabric>,
}

impl Worker {
    fn new(
        cfg: WorkerConfig,
        rx: Receiver<Cmd>,
        pending: Arc<AtomicBool>,
        wake_fd: Notifier,
        registry: Arc<Mutex<BTreeMap<PortId, Arc<PortStats>>>>,
    ) -> io::Result<Self> {
        let epoll = Epoll::new()?;
        epoll.ctl(libc::EPOLL_CTL_ADD, wake_fd.as_raw_fd(), WAKE_TOKEN);
        let timer = Timer::new()?;
        epoll.ctl(libc::EPOLL_CTL_ADD, timer.0.as_raw_fd(), TIMER_TOKEN);
        Ok(Self {
            cfg,
            rx,
            pending,
            wake_fd,
            registry,
            ports: Vec::new(),
            epoll,
            quit: false,
            faults: 0,
            wake: WakeCost {
                typical: std::time::Duration::from_micros(30),
                floor: std::time::Duration::from_micros(10),
            },
            timer,
            fabric: match cfg.role {
                Role::Switch(sc) => Some(Fabric::new(sc, cfg.batch)),
                _ => None,
            },
        })
    }

    fn port_mut(&mut self, id: PortId) -> Option<&mut Port> {
        self.ports.iter_mut().find(|p| p.id == id)
    }

    fn commands(&mut self, now: Instant) {
        while let Ok(c) = self.rx.try_recv() {
            match c {
                Cmd::AddPort(id) => {
                    // A switch port keeps its counters across reconnections.
                    let stats = self
                        .registry
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(id)
                        .or_default()
                        .clone();
                    stats.up.store(1, Ordering::Relaxed);
                    self.ports.push(Port::new(id, self.cfg.role, stats));
                    self.ports.sort_by_key(|p| p.id);
                }
                Cmd::Start(id, q) => {
                    let index = q.index;
                    if let Some(fd) = q.kick.as_ref().map(AsRawFd::as_raw_fd) {
                        self.epoll.ctl(libc::EPOLL_CTL_ADD, fd, token(id, index));
                    }
                    let policy = if index.is_multiple_of(2) {
                        self.cfg.rx_policy
                    } else {
                        self.cfg.policy
                    };
                    let wake = self.wake;
                    match self.port_mut(id) {
                        Some(p) => p.start(q, policy, wake, now),
                        None => warn!(port = id, "queue for unknown port"),
                    }
                }
                Cmd::Stop(id, index, reply) => {
                    if index % 2 == 1 {
                        self.drain(id, now);
                    }
                    let base = self.stop_queue(id, index);
                    let _ = reply.send(base);
                }
                Cmd::Mem(id, mem) => {
                    if let Some(p) = self.port_mut(id) {
                        let stats = p.stats.clone();
                        for s in [&mut p.rx, &mut p.tx].into_iter().flatten() {
                            if let Err(e) = s.q.set_mem(mem.clone()) {
                                s.fail(id, &stats, e);
                            }
                        }
                    }
                }
                Cmd::RemovePort(id, reply) => {
                    self.stop_queue(id, 0);
                    self.stop_queue(id, 1);
                    if let Some(i) = self.ports.iter().position(|p| p.id == id) {
                        let p = self.ports.remove(i);
                        p.stats.up.store(0, Ordering::Relaxed);
                        info!(port = id, stats = ?p.stats.snapshot(id), "port removed");
                    }
                    if let Some(f) = &mut self.fabric {
                        f.port_down(id);
                    }
                    let _ = reply.send(());
                }
                Cmd::AddHost(h) => {
                    if let Some(f) = &mut self.fabric {
                        if let Some(fd) = h.tap_fd() {
                            self.epoll
                                .ctl(libc::EPOLL_CTL_ADD, fd, token(h.id, HOST_QUEUE));
                        }
                        h.stats.up.store(1, Ordering::Relaxed);
                        info!(port = h.id, kind = ?h.kind_name(), "host port added");
                        f.hosts.push(*h);
                    } else {
                        warn!(port = h.id, "host ports need the switch role");
                    }
                }
                Cmd::Macs(reply) => {
                    let v = self
                        .fabric
                        .as_ref()
                        .map(|f| f.macs.entries(now))
                        .unwrap_or_default();
                    let _ = reply.send(v);
                }
                Cmd::Shutdown => self.quit = true,
            }
        }
    }

    /// A peer shrank memory it shared and an access faulted: stop every queue whose memory
    /// table holds a faulted mapping. Everything else goes on.
    fn check_faults(&mut self) {
        let g = pvnet_vhost::fault::generation();
        if g == self.faults {
            return;
        }
        self.faults = g;
        for p in &mut self.ports {
            let (id, stats) = (p.id, p.stats.clone());
            for s in [p.rx.as_mut(), p.tx.as_mut()].into_iter().flatten() {
                if pvnet_vhost::mmap::table_faulted(s.q.mem()) {
                    s.fail(id, &stats, virtq::Error::MemoryFault);
                }
            }
        }
    }

    /// Runs poll rounds until nothing moves (at most one ring's worth): a frontend that stops
    /// its transmit ring (GET_VRING_BASE) has every packet it made available before the stop
    /// taken, even when the worker was off its CPU when the frontend stopped sending.
    fn drain(&mut self, id: PortId, now: Instant) {
        let size = self
            .port_mut(id)
            .and_then(|p| p.tx.as_ref())
            .map_or(0, |s| s.q.size());
        let rounds = usize::from(size / self.cfg.batch.max(1)) + 1;
        for _ in 0..rounds {
            if self.poll_once(now) == 0 {
                break;
            }
        }
    }

    fn stop_queue(&mut self, id: PortId, index: u16) -> Option<u16> {
        let p = self.port_mut(id)?;
        let slot = if index.is_multiple_of(2) {
            p.rx.take()
        } else {
            p.tx.take()
        }?;
        let (srtt, var, probe) = slot.poll.estimate();
        let (hits, misses) = slot.poll.hits_misses();
        info!(
            port = id, queue = index, policy = %slot.poll.policy(), window = ?slot.poll.window(),
            gap = ?srtt, gap_dev = ?var, probe_every = probe, hits, misses, "queue polling summary"
        );
        if let Some(k) = &slot.kick {
            let fd = k.as_raw_fd();
            self.epoll.ctl(libc::EPOLL_CTL_DEL, fd, 0);
        }
        Some(slot.q.last_avail())
    }

    /// One round over every port. Returns the packets moved.
    fn poll_once(&mut self, now: Instant) -> usize {
        let batch = self.cfg.batch;
        let mut work = 0;
        match self.cfg.role {
            Role::Sink => {
                for p in &mut self.ports {
                    work += p.sink(batch);
                }
            }
            Role::Gen(_) => {
                for p in &mut self.ports {
                    work += p.sink(batch);
                    work += p.generate(batch, now);
                }
            }
            Role::Echo => {
                for p in &mut self.ports {
                    work += p.echo(batch);
                }
            }
            Role::Switch(_) => {
                if let Some(f) = &mut self.fabric {
                    work += f.round(&mut self.ports, now);
                }
            }
            Role::Forward => {
                for i in 0..self.ports.len() {
                    let peer = self.ports[i].id ^ 1;
                    let j = self.ports.iter().position(|p| p.id == peer);
                    work += match j {
                        Some(j) => {
                            let (a, b) = pair_mut(&mut self.ports, i, j);
                            forward(a, Some(b), batch)
                        }
                        None => forward(&mut self.ports[i], None, batch),
                    };
                }
            }
        }
        work
    }

    /// Asks every queue the worker would wait on what it wants after this round, and arms
    /// (arm, fence, re-check) those that may sleep with notifications on. Returns `None` if a
    /// queue wants polling or work arrived while arming; otherwise when to wake at the latest.
    fn settle(&mut self, now: Instant) -> Option<Option<Instant>> {
        let gen = matches!(self.cfg.role, Role::Gen(_));
        let mut poll = false;
        let mut deadline: Option<Instant> = None;
        for p in &mut self.ports {
            // A receive queue matters only while we wait for the frontend's buffers.
            let want_rx = p.rx_blocked && (!gen || p.gen_active());
            for (s, wanted) in [(p.tx.as_mut(), true), (p.rx.as_mut(), want_rx)] {
                let Some(s) = s.filter(|s| !s.broken) else {
                    continue;
                };
                if std::mem::take(&mut s.worked) {
                    s.poll.on_work(now);
                    poll = true;
                    continue;
                }
                if !wanted {
                    continue;
                }
                match s.poll.on_empty(now) {
                    Idle::Poll => poll = true,
                    Idle::Arm => {}
                    Idle::Until(t) => deadline = Some(deadline.map_or(t, |d: Instant| d.min(t))),
                }
            }
        }
        if let Some(f) = &self.fabric {
            match f.idle(now) {
                Idle::Poll => poll = true,
                Idle::Arm => {}
                Idle::Until(t) => deadline = Some(deadline.map_or(t, |d: Instant| d.min(t))),
            }
        }
        if poll {
            return None;
        }
        // Everyone may sleep: arm those that sleep with notifications on.
        let mut armed = Armed::Empty;
        for p in &mut self.ports {
            let (id, stats) = (p.id, p.stats.clone());
            let want_rx = p.rx_blocked && (!gen || p.gen_active());
            for (s, wanted) in [(p.tx.as_mut(), true), (p.rx.as_mut(), want_rx)] {
                let Some(s) = s.filter(|s| wanted && !s.broken) else {
                    continue;
                };
                if matches!(s.poll.policy(), Policy::Timer(_)) {
                    continue;
                }
                match s.q.arm_notify() {
                    Ok(Armed::Empty) => {}
                    Ok(Armed::NotEmpty) => armed = Armed::NotEmpty,
                    Err(e) => s.fail(id, &stats, e),
                }
            }
        }
        if armed == Armed::NotEmpty || self.pending.load(Ordering::Acquire) {
            self.disarm(false);
            return None;
        }
        Some(deadline)
    }

    /// How long transmit-completion calls are held back: the configured delay, at least two
    /// wake-ups (the polling window's bound).
    fn call_bound(&self) -> std::time::Duration {
        self.cfg.tx_call_delay.max(self.wake.typical * 2)
    }

    /// Sends the owed transmit-completion calls that are due, and those of ports whose
    /// frontend was just called for received packets anyway (one interruption of the driver
    /// instead of two: with INTx the guest's handler looks at every queue).
    fn flush_calls(&mut self, now: Instant) {
        let bound = self.call_bound();
        for p in &mut self.ports {
            let rx_called = p.rx.as_mut().is_some_and(QueueSlot::take_called);
            if let Some(s) = p.tx.as_mut() {
                s.flush_call(&p.stats, now, bound, rx_called);
            }
        }
    }

    /// When the earliest owed call falls due (the worker must be awake to send it). Only
    /// transmit queues owe calls (`QueueSlot::publish`), as in `flush_calls`.
    fn calls_due(&self) -> Option<Instant> {
        let bound = self.call_bound();
        self.ports
            .iter()
            .filter_map(|p| p.tx.as_ref()?.call_due(bound))
            .min()
    }

    /// Back to polling: notifications off. `slept` says whether the worker actually slept
    /// (the gaps that end next were seen one wake-up late) or only armed and found work.
    fn disarm(&mut self, slept: bool) {
        for p in &mut self.ports {
            for s in [p.tx.as_mut(), p.rx.as_mut()].into_iter().flatten() {
                s.q.disable_notify();
                if slept {
                    s.poll.woke();
                }
            }
        }
    }

    fn sleep(&mut self, deadline: Option<Instant>, now: Instant) {
        for p in &self.ports {
            bump(&p.stats.sleeps, 1);
        }
        // A generator waiting for buffers still has an end to keep.
        let gen_cap = self
            .ports
            .iter()
            .any(Port::gen_active)
            .then(|| now + std::time::Duration::from_millis(10));
        let wake_at = match (deadline, gen_cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timed = wake_at.map(|t| {
            t.saturating_duration_since(now)
                .max(std::time::Duration::from_micros(1))
        });
        if let Some(d) = timed {
            self.timer.set(d);
        }
        // Deadlines come from the timerfd: epoll itself waits without a timeout.
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 16];
        let n = self.epoll.wait(&mut evs, -1);
        if timed.is_some() {
            self.timer.set(std::time::Duration::ZERO);
            self.timer.drain();
        }
        for ev in &evs[..n] {
            let tok = ev.u64;
            if tok == WAKE_TOKEN {
                self.wake_fd.drain();
                continue;
            }
            if tok == TIMER_TOKEN {
                self.timer.drain();
                continue;
            }
            let (port, index) = (
                u32::try_from(tok >> 16).unwrap_or(u32::MAX),
                (tok & 0xffff) as u16,
            );
            if let Some(p) = self.port_mut(port) {
                let slot = if index.is_multiple_of(2) {
                    p.rx.as_ref()
                } else {
                    p.tx.as_ref()
                };
                if let Some(k) = slot.and_then(|s| s.kick.as_ref()) {
                    bump(&p.stats.kicks, k.drain());
                }
            }
        }
    }

    fn run(&mut self, clock: &impl Clock) {
        info!(
            role = ?self.cfg.role, policy = %self.cfg.policy, rx_policy = %self.cfg.rx_policy,
            wake_us = self.wake.typical.as_secs_f64() * 1e6, wake_floor_us = self.wake.floor.as_secs_f64() * 1e6, batch = self.cfg.batch, "worker running"
        );
        while !self.quit {
            // Acquire: pairs with the release in `Dataplane::send`; the command is visible.
            if self.pending.load(Ordering::Relaxed) && self.pending.swap(false, Ordering::Acquire) {
                self.commands(clock.now());
                continue;
            }
            // One clock read per round (per batch of every queue), not per packet.
            let now = clock.now();
            self.poll_once(now);
            self.check_faults();
            self.flush_calls(now);
            let Some(deadline) = self.settle(now) else {
                std::hint::spin_loop();
                continue;
            };
            // About to sleep: an owed call still goes out when due (the timer wakes us).
            let deadline = match (deadline, self.calls_due()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            self.sleep(deadline, now);
            self.disarm(true);
            if let Some(f) = &mut self.fabric {
                f.woke();
            }
        }
        info!("worker stopped");
    }
}

fn pair_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert!(i != j);
    if i < j {
        let (a, b) = v.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = v.split_at_mut(i);
        (&mut b[0], &mut a[j])
    }
}
