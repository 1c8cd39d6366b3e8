//! The live port set of `pvnet switch`: ports added, deleted and changed while the switch
//! runs (`pvnet ctl port add|del|set`, a reload of the configuration file on `SIGHUP` or
//! `pvnet ctl reload`), each started and stopped whole.
//!
//! A port's id is never reused: counters of a deleted port are not mixed into a new one of
//! the same name. Ports added over the control socket can be kept across restarts in a state
//! file (`--state`): it is rewritten (atomically) after each change and read at start, after
//! the configuration's own ports. Ports from the configuration file and `--port` are never
//! written there: the file stays the configuration's source of truth.

use super::config::{
    check_port, egress_of, fmt_mac, host_io, io_name, kernel_egress, parse_mac, parse_port_spec,
    port_policy, spec_value, vlan_mode, vxlan_config, xdp_config, xdp_egress, xdp_lanes,
    FileConfig, PortConfig,
};
use crate::ctl::{self, PortInfo, Reply};
use crate::error::{io, usage, Result};
use pvnet_dataplane::EgressConfig;
use pvnet_dataplane::GenSpec;
use pvnet_dataplane::HostDev;
use pvnet_dataplane::Policy;
use pvnet_dataplane::PortSnapshot;
use pvnet_dataplane::{Dataplane, HostPort};
use pvnet_vhost::backend::{
    connect_loop, serve_port, BackendConfig, DeviceHooks, Listener, PortId, SharedConfig,
};
use pvnet_vhost::features::{DEVICE_FEATURES, OFFLOAD_FEATURES};
use pvnet_vhost::Stop;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// Where a port came from: what a reload may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The configuration file or `--port`: a reload applies the file's changes to it.
    Config,
    /// `pvnet ctl port add` (or the state file): a reload leaves it alone.
    Ctl,
}

/// What keeps a running port going.
enum Running {
    /// A vhost-user port's listener or connector thread (stopping it disconnects the
    /// frontend), and the offer each new connection reads.
    Vhost {
        stop: Arc<Stop>,
        thread: Option<JoinHandle<()>>,
        offer: SharedConfig,
    },
    /// A host port (the shard owns its device). A persistent tap keeps a second fd here so
    /// that deleting the port can make the interface go away.
    Host { persist: Option<OwnedFd> },
}

struct Live {
    id: PortId,
    cfg: PortConfig,
    origin: Origin,
    detail: String,
    run: Running,
}

#[derive(Default)]
struct Inner {
    next: PortId,
    ports: BTreeMap<String, Live>,
}

/// The switch's ports, as the control plane changes them.
pub(crate) struct Runtime {
    dp: Arc<Dataplane>,
    started: Instant,
    state: Option<PathBuf>,
    inner: Mutex<Inner>,
    /// The switch-wide MTU, for ports that set none.
    mtu: Option<u16>,
}

/// What a vhost-user port's settings make of it: its egress and its offer (what each new
/// connection negotiates from). An error for a bad egress key; None for another kind.
fn vhost_parts(p: &PortConfig) -> Result<Option<(EgressConfig, BackendConfig)>> {
    let PortConfig::VhostUser {
        name,
        queue_pairs,
        offloads,
        qdisc,
        dql,
        dql_target_us,
        dql_witness,
        bulk,
        limit,
        ecn,
        mtu,
        ..
    } = p
    else {
        return Ok(None);
    };
    let offer = BackendConfig {
        queue_pairs: *queue_pairs,
        mtu: *mtu,
        features: if *offloads {
            DEVICE_FEATURES | OFFLOAD_FEATURES
        } else {
            DEVICE_FEATURES
        },
        ..BackendConfig::default()
    };
    Ok(Some((
        egress_of(
            name,
            qdisc,
            (*dql, *dql_target_us, *dql_witness),
            *bulk,
            (*limit, *ecn),
        )?,
        offer,
    )))
}

/// How `pvnet ctl` describes an egress: `fq_codel+dql`, `fifo, one per dequeue`, `none`.
fn egress_text(e: &EgressConfig) -> String {
    format!(
        "{}{}{}{}",
        e.queue.map_or("none".into(), |q| q.qdisc.to_string()),
        match e.queue {
            Some(q) if q.qdisc == pvnet_dataplane::Qdisc::FqCodel && !q.ecn => " (no ecn)",
            _ => "",
        },
        match (e.dql, e.dql_target.as_micros()) {
            (false, _) => String::new(),
            (true, 0) => "+dql".into(),
            (true, us) if e.dql_witness => format!("+dql (target {us} us, reserve on trial)"),
            (true, us) => format!("+dql (target {us} us)"),
        },
        if e.bulk || e.queue.is_none() {
            ""
        } else {
            ", one per dequeue"
        }
    )
}

/// How `pvnet ctl` describes a vhost-user port.
fn vhost_detail(
    socket: &Path,
    client: bool,
    egress: &EgressConfig,
    policy: Option<Policy>,
) -> String {
    format!(
        "{}{}, egress {}{}",
        socket.display(),
        if client { " (client)" } else { "" },
        egress_text(egress),
        policy.map_or(String::new(), |p| format!(", policy {p}"))
    )
}

/// How `pvnet ctl` describes a port: its detail, then its VLAN settings if it has some.
fn with_vlan(detail: &str, p: &PortConfig) -> String {
    match vlan_mode(p) {
        Ok(Some(m)) if detail.is_empty() => m.to_string(),
        Ok(Some(m)) => format!("{detail}, {m}"),
        _ => detail.to_string(),
    }
}

/// Whether `new` can replace `old` in place (`port set`): a change of its VLAN settings
/// alone (any kind), or a vhost-user port on the same socket, the same way round. Anything
/// else is deleted and added again.
fn in_place(old: &PortConfig, new: &PortConfig) -> bool {
    old.without_vlan() == new.without_vlan()
        || matches!(
            (old, new),
            (
                PortConfig::VhostUser { socket: s0, client: c0, .. },
                PortConfig::VhostUser { socket: s1, client: c1, .. },
            ) if s0 == s1 && c0 == c1
        )
}

impl Runtime {
    pub(crate) fn new(dp: Arc<Dataplane>, state: Option<PathBuf>) -> Self {
        Self {
            dp,
            started: Instant::now(),
            state,
            inner: Mutex::new(Inner::default()),
            mtu: None,
        }
    }

    /// Ports added later that set no MTU get `mtu` (the switch's `--mtu`).
    pub(crate) fn with_mtu(mut self, mtu: Option<u16>) -> Self {
        self.mtu = mtu;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of ports.
    pub(crate) fn len(&self) -> usize {
        self.lock().ports.len()
    }

    /// A kernel port's egress settings, its send buffer set on `dev` first.
    fn kernel_egress(p: &PortConfig, dev: &HostDev) -> Result<EgressConfig> {
        let (egress, sndbuf) = kernel_egress(p)?
            .ok_or_else(|| usage(format!("port {}: not a kernel port", p.name())))?;
        if let Some(b) = sndbuf {
            dev.set_sndbuf(b)
                .map_err(io(format!("port {}: sndbuf", p.name())))?;
        }
        Ok(egress)
    }

    /// Starts port `id` as `p` says; returns what keeps it running and its description.
    fn start(&self, id: PortId, p: &PortConfig) -> Result<(Running, String)> {
        match p {
            PortConfig::VhostUser { .. } => self.start_vhost(id, p),
            PortConfig::Tap { .. } => self.start_tap(id, p),
            PortConfig::AfPacket {
                name,
                ifname,
                io: pio,
                direct,
                ..
            } => {
                let pio = host_io(name, pio)?;
                let sock = pvnet_dataplane::packet::open(ifname)
                    .map_err(io(format!("port {name}: AF_PACKET")))?;
                info!(port = %name, ifname = %ifname, "AF_PACKET socket bound");
                let dev = HostDev::Packet(sock);
                let egress = Self::kernel_egress(p, &dev)?;
                self.dp.add_host(id, HostPort::Kernel(dev, pio, *direct));
                if egress.queue.is_some() {
                    self.dp.set_egress(id, egress);
                }
                Ok((
                    Running::Host { persist: None },
                    format!(
                        "{ifname}, {}, egress {}",
                        io_name(pio, *direct),
                        egress_text(&egress)
                    ),
                ))
            }
            PortConfig::AfXdp { name, ifname, .. } => {
                let not = || usage(format!("port {name}: not af-xdp"));
                let cfg = xdp_config(p)?.ok_or_else(not)?;
                let egress = xdp_egress(p)?.ok_or_else(not)?;
                let dev = pvnet_dataplane::xdp::XdpDev::open(&cfg)
                    .map_err(io(format!("port {name}: AF_XDP")))?
                    .with_lanes(xdp_lanes(p)?);
                let mut detail = format!("{}, egress {}", dev.describe(), egress_text(&egress));
                info!(port = %name, ifname = %ifname, mode = dev.mode().name(), zerocopy = dev.zerocopy(), "AF_XDP sockets bound");
                let workers = self.dp.add_host(id, HostPort::AfXdp(dev));
                if workers > 1 {
                    detail.push_str(&format!(", {workers} lanes (a worker each)"));
                }
                if egress.queue.is_some() {
                    self.dp.set_egress(id, egress);
                }
                Ok((Running::Host { persist: None }, detail))
            }
            PortConfig::Vxlan { name, .. } => {
                let cfg =
                    vxlan_config(p)?.ok_or_else(|| usage(format!("port {name}: not vxlan")))?;
                let u = pvnet_dataplane::VxlanUnderlay::open(&cfg)
                    .map_err(io(format!("port {name}: VXLAN")))?;
                let detail = u.describe();
                info!(port = %name, %detail, "VXLAN sockets bound");
                self.dp.add_host(id, HostPort::Vxlan(u));
                Ok((Running::Host { persist: None }, detail))
            }
            PortConfig::Sink { .. } => {
                self.dp.add_host(id, HostPort::Sink);
                Ok((Running::Host { persist: None }, String::new()))
            }
            PortConfig::Gen { .. } => self.start_gen(id, p),
        }
    }

    /// Starts a vhost-user port: its listener (bound here: a path that cannot be bound is
    /// this request's error) or connector, on a thread of its own.
    fn start_vhost(&self, id: PortId, p: &PortConfig) -> Result<(Running, String)> {
        let name = p.name().to_string();
        let at = |what: &dyn std::fmt::Display| io(format!("port {name}: {what}"));
        let (PortConfig::VhostUser { socket, client, .. }, Some((egress, offer))) =
            (p, vhost_parts(p)?)
        else {
            return Err(usage(format!("port {name}: not vhost-user")));
        };
        let listener = if *client {
            None
        } else {
            Some(Listener::bind(socket).map_err(at(&socket.display()))?)
        };
        self.dp.set_egress(id, egress);
        let policy = port_policy(p)?;
        if policy.is_some() {
            self.dp.set_tx_policy(id, policy);
        }
        let offer = Arc::new(Mutex::new(offer));
        let stop = Stop::new().map_err(at(&"eventfd"))?;
        let hooks: Arc<dyn DeviceHooks> = self.dp.clone();
        let (path, st, of, n) = (socket.clone(), stop.clone(), offer.clone(), name.clone());
        let thread = std::thread::Builder::new()
            .name(format!("vu-{name}"))
            .spawn(move || match listener {
                None => connect_loop(&path, of, hooks, st, Duration::from_millis(200), Some(id)),
                Some(l) => {
                    if let Err(e) = serve_port(l, id, of, hooks, st) {
                        error!(port = %n, socket = %path.display(), "port stopped serving: {e}");
                    }
                }
            })
            .map_err(at(&"thread"))?;
        Ok((
            Running::Vhost {
                stop,
                thread: Some(thread),
                offer,
            },
            vhost_detail(socket, *client, &egress, policy),
        ))
    }

    /// Starts a tap port: opens (or attaches to) the interface and brings it up.
    fn start_tap(&self, id: PortId, p: &PortConfig) -> Result<(Running, String)> {
        let PortConfig::Tap {
            name,
            ifname,
            offloads,
            mtu,
            io: tap_io,
            direct,
            persist,
            ..
        } = p
        else {
            return Err(usage(format!("port {}: not a tap", p.name())));
        };
        let at = |what: &dyn std::fmt::Display| io(format!("port {name}: {what}"));
        let tap_io = host_io(name, tap_io)?;
        let want = ifname.clone().unwrap_or_else(|| "pvtap%d".into());
        let tap = pvnet_dataplane::tap::open(&want, *offloads).map_err(at(&"tap"))?;
        tap.link_up(*mtu).map_err(at(&"link up"))?;
        let keep = if *persist {
            tap.set_persist(true).map_err(at(&"persist"))?;
            Some(tap.try_clone_fd().map_err(at(&"dup"))?)
        } else {
            None
        };
        let ifn = tap.name().to_string();
        info!(port = %name, ifname = %ifn, offloads = *offloads, persist = *persist, "tap ready");
        let dev = HostDev::Tap(tap);
        let egress = Self::kernel_egress(p, &dev)?;
        self.dp.add_host(id, HostPort::Kernel(dev, tap_io, *direct));
        if egress.queue.is_some() {
            self.dp.set_egress(id, egress);
        }
        let detail = format!(
            "{ifn}, {}{}, egress {}",
            io_name(tap_io, *direct),
            if *persist { ", persistent" } else { "" },
            egress_text(&egress)
        );
        Ok((Running::Host { persist: keep }, detail))
    }

    /// Starts a generator port.
    fn start_gen(&self, id: PortId, p: &PortConfig) -> Result<(Running, String)> {
        let PortConfig::Gen {
            rate,
            secs,
            delay,
            frame_len,
            src,
            dst,
            flows,
            ..
        } = p
        else {
            return Err(usage(format!("port {}: not a generator", p.name())));
        };
        let spec = GenSpec {
            frame_len: *frame_len,
            rate: *rate,
            duration: (*secs > 0.0).then(|| Duration::from_secs_f64(*secs)),
            delay: Duration::from_secs_f64(*delay),
            src: parse_mac(src)?,
            dst: parse_mac(dst)?,
            flows: *flows,
        };
        self.dp.add_host(id, HostPort::Gen(spec));
        let r = if *rate == 0 {
            "max rate".into()
        } else {
            format!("{rate} pps")
        };
        Ok((
            Running::Host { persist: None },
            format!("{src} -> {dst}, {r}"),
        ))
    }

    /// Adds a port; `Ok(false)` if an identical one is there already (idempotent).
    pub(crate) fn add(&self, p: PortConfig, origin: Origin) -> Result<bool> {
        let p = p.with_mtu(self.mtu);
        check_port(&p)?;
        let name = p.name().to_string();
        let mut g = self.lock();
        if let Some(l) = g.ports.get(&name) {
            if l.cfg == p {
                return Ok(false);
            }
            return Err(usage(format!(
                "port {name} exists with other settings ({}): delete it first, or change it with `pvnet ctl port set`",
                l.cfg.spec()
            )));
        }
        if let Some(other) = g
            .ports
            .values()
            .find(|l| l.cfg.resource() == p.resource() && p.resource().is_some())
        {
            return Err(usage(format!(
                "port {name}: {} is port {}'s",
                p.resource().unwrap_or_default(),
                other.cfg.name()
            )));
        }
        let id = g.next;
        g.next = id
            .checked_add(1)
            .ok_or_else(|| usage("port ids exhausted"))?;
        // Its VLAN settings reach every shard before the port does.
        let vlan = vlan_mode(&p)?;
        if vlan.is_some() {
            self.dp.set_vlan(id, vlan.clone());
        }
        let (run, detail) = match self.start(id, &p) {
            Ok(r) => r,
            Err(e) => {
                if vlan.is_some() {
                    self.dp.set_vlan(id, None);
                }
                return Err(e);
            }
        };
        info!(port = %name, id, kind = p.kind(), %detail, ?origin, "port added");
        g.ports.insert(
            name,
            Live {
                id,
                cfg: p,
                origin,
                detail,
                run,
            },
        );
        drop(g);
        if origin == Origin::Ctl {
            self.save_state();
        }
        Ok(true)
    }

    /// Deletes a port: a vhost-user frontend is disconnected (its listener or connector
    /// stops), the shard lets go of it, what waited in its egress queue is counted as dropped
    /// (`port_down`), a persistent tap stops being persistent. Returns its last counters, or
    /// None if there was no such port.
    pub(crate) fn del(&self, name: &str) -> Option<PortInfo> {
        let live = self.lock().ports.remove(name)?;
        let Live {
            id,
            cfg,
            origin,
            detail,
            mut run,
        } = live;
        if let Running::Vhost { stop, thread, .. } = &mut run {
            stop.set();
            if let Some(t) = thread.take() {
                if t.join().is_err() {
                    warn!(port = %name, "the port's thread panicked");
                }
            }
        } else if let Running::Host { persist: Some(fd) } = &run {
            if let Err(e) = pvnet_dataplane::tap::set_persist_fd(fd.as_fd(), false, name) {
                warn!(port = %name, "{e}");
            }
        }
        let last = self.dp.remove_port(id).unwrap_or_default();
        if matches!(vlan_mode(&cfg), Ok(Some(_))) {
            self.dp.set_vlan(id, None);
        }
        drop(run);
        let info = PortInfo {
            name: name.to_string(),
            kind: cfg.kind().into(),
            state: "deleted".into(),
            detail,
            counters: counters(&last),
            error: last.last_error.clone(),
            queues: last.queues.iter().map(counters).collect(),
        };
        info!(port = %name, id, counters = ?info.counters, "port deleted");
        if origin == Origin::Ctl {
            self.save_state();
        }
        Some(info)
    }

    /// Changes settings of a port in place: the VLAN settings of any port, at once (what
    /// was learned on it in VLANs it no longer carries is forgotten); a vhost-user port's
    /// egress settings at once (what waited in the old queue is dropped, counted as
    /// `reconfigured`), its `offloads` and `queue_pairs` from its frontend's next connection.
    /// Returns what changed, as notes (empty: nothing did).
    pub(crate) fn set(&self, name: &str, kv: &BTreeMap<String, String>) -> Result<Vec<String>> {
        let new = {
            let g = self.lock();
            let l = g
                .ports
                .get(name)
                .ok_or_else(|| usage(format!("no port {name}")))?;
            let mut t =
                toml::Table::try_from(&l.cfg).map_err(|e| usage(format!("port {name}: {e}")))?;
            for (k, v) in kv {
                if k == "kind" || k == "name" {
                    return Err(usage(format!(
                        "port {name}: {k} cannot change (delete the port and add another)"
                    )));
                }
                if v.trim().is_empty() {
                    // `key=`: the key goes back to its default (`vlan=` to leave a VLAN).
                    t.remove(k);
                } else if k == "trunk" {
                    t.insert(k.clone(), toml::Value::String(v.trim().into()));
                } else {
                    t.insert(k.clone(), spec_value(v));
                }
            }
            PortConfig::deserialize(toml::Value::Table(t))
                .map_err(|e| usage(format!("port {name}: {e}")))?
        };
        self.replace_in_place(name, new)
    }

    /// Applies `new` to port `name` in place (see [`Runtime::set`]).
    fn replace_in_place(&self, name: &str, new: PortConfig) -> Result<Vec<String>> {
        check_port(&new)?;
        let mut g = self.lock();
        let l = g
            .ports
            .get_mut(name)
            .ok_or_else(|| usage(format!("no port {name}")))?;
        if l.cfg == new {
            return Ok(Vec::new());
        }
        if !in_place(&l.cfg, &new) {
            return Err(usage(format!(
                "port {name}: only VLAN settings (vlan, trunk, native) and a vhost-user port's egress (qdisc, dql, dql_target_us, dql_witness, bulk, limit), policy, offloads and queue_pairs change in place; delete the port and add it again"
            )));
        }
        let mut notes = Vec::new();
        let (v0, v1) = (vlan_mode(&l.cfg)?, vlan_mode(&new)?);
        if v0 != v1 {
            self.dp.set_vlan(l.id, v1.clone());
            notes.push(format!(
                "VLANs now {}, applied at once (addresses learned on it in VLANs it no longer carries are forgotten)",
                v1.map_or("none (untagged, VLAN 0)".into(), |m| m.to_string())
            ));
        }
        // Beyond the VLAN keys: a vhost-user port's egress, policy and offer.
        if l.cfg.without_vlan() != new.without_vlan() {
            let (Some((e0, o0)), Some((e1, o1)), PortConfig::VhostUser { socket, client, .. }) =
                (vhost_parts(&l.cfg)?, vhost_parts(&new)?, &new)
            else {
                return Err(usage(format!("port {name}: not a vhost-user port")));
            };
            if e0 != e1 {
                self.dp.set_egress(l.id, e1);
                notes.push(format!(
                    "egress now {}, applied at once (packets that waited in the old queue count as drops_reconfigured)",
                    egress_text(&e1)
                ));
            }
            let (p0, p1) = (port_policy(&l.cfg)?, port_policy(&new)?);
            if p0 != p1 {
                self.dp.set_tx_policy(l.id, p1);
                notes.push(format!(
                    "transmit-ring policy now {}, applied at once",
                    p1.map_or("the switch's".into(), |p| p.to_string())
                ));
            }
            if (o0.queue_pairs, o0.features) != (o1.queue_pairs, o1.features) {
                if let Running::Vhost { offer, .. } = &l.run {
                    *offer.lock().unwrap_or_else(|e| e.into_inner()) = o1;
                }
                notes.push(format!(
                    "offer now queue_pairs={} offloads={}: applies from the frontend's next connection (features are negotiated once per connection)",
                    o1.queue_pairs,
                    o1.features & OFFLOAD_FEATURES != 0
                ));
            }
            l.detail = vhost_detail(socket, *client, &e1, p1);
        }
        l.cfg = new;
        let origin = l.origin;
        info!(port = %name, changes = ?notes, "port changed");
        drop(g);
        if origin == Origin::Ctl {
            self.save_state();
        }
        Ok(notes)
    }

    /// Makes the configuration's ports what `want` says (a reload): ports gone from it are
    /// deleted, new ones added, changed ones changed in place where they can be and replaced
    /// otherwise. Ports added over the control socket are left alone. Returns what happened,
    /// one line each; a port that fails is reported and the others still applied.
    pub(crate) fn reconcile(&self, want: &[PortConfig]) -> Vec<String> {
        let mut notes = Vec::new();
        let current: Vec<(String, Origin, PortConfig)> = self
            .lock()
            .ports
            .iter()
            .map(|(n, l)| (n.clone(), l.origin, l.cfg.clone()))
            .collect();
        for (name, origin, _) in &current {
            if *origin == Origin::Config
                && !want.iter().any(|p| p.name() == name)
                && self.del(name).is_some()
            {
                notes.push(format!("deleted {name}"));
            }
        }
        for p in want {
            let name = p.name();
            let now = current.iter().find(|(n, ..)| n == name);
            let r = match now {
                None => self.add(p.clone(), Origin::Config).map(|_| format!("added {name}")),
                Some((_, Origin::Ctl, cfg)) if cfg == p => {
                    if let Some(l) = self.lock().ports.get_mut(name) {
                        l.origin = Origin::Config;
                    }
                    self.save_state();
                    Ok(format!("{name}: now in the configuration file"))
                }
                Some((_, Origin::Ctl, _)) => Err(usage(format!(
                    "{name}: the configuration file has a port of that name, but the one added over the control socket differs: left as it is"
                ))),
                Some((_, _, cfg)) if cfg == p => continue,
                Some((_, _, cfg)) if in_place(cfg, p) => self
                    .replace_in_place(name, p.clone())
                    .map(|n| format!("changed {name}: {}", n.join("; "))),
                Some(_) => check_port(p).and_then(|()| {
                    self.del(name);
                    self.add(p.clone(), Origin::Config)
                        .map(|_| format!("replaced {name} (deleted and added again)"))
                }),
            };
            notes.push(r.unwrap_or_else(|e| format!("{name}: not applied: {e}")));
        }
        notes
    }

    /// Adds the ports saved in the state file (at start, after the configuration's).
    pub(crate) fn restore_state(&self) -> Result<usize> {
        let Some(path) = &self.state else {
            return Ok(0);
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io(path.display())(e)),
        };
        let f: FileConfig =
            toml::from_str(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?;
        let mut n = 0;
        for p in f.port {
            let name = p.name().to_string();
            match self.add(p, Origin::Ctl) {
                Ok(_) => n += 1,
                Err(e) => {
                    warn!(port = %name, state = %path.display(), "saved port not restored: {e}")
                }
            }
        }
        Ok(n)
    }

    /// Writes the ports added over the control socket to the state file (atomically).
    fn save_state(&self) {
        let Some(path) = &self.state else { return };
        let mut ports: Vec<(PortId, PortConfig)> = self
            .lock()
            .ports
            .values()
            .filter(|l| l.origin == Origin::Ctl)
            .map(|l| (l.id, l.cfg.clone()))
            .collect();
        ports.sort_by_key(|p| p.0);
        let f = FileConfig {
            port: ports.into_iter().map(|p| p.1).collect(),
            ..FileConfig::default()
        };
        if let Err(e) = write_atomic(path, &f) {
            error!(state = %path.display(), "cannot save the ports added at runtime: {e}");
        }
    }

    /// The status `pvnet ctl` and the metrics show.
    pub(crate) fn status(&self) -> ctl::Status {
        let snaps: BTreeMap<PortId, PortSnapshot> = self
            .dp
            .snapshots()
            .into_iter()
            .map(|s| (s.port, s))
            .collect();
        let (mut rows, names): (Vec<(PortId, PortInfo)>, BTreeMap<PortId, String>) = {
            let g = self.lock();
            let rows = g
                .ports
                .iter()
                .map(|(name, l)| {
                    let s = snaps.get(&l.id).cloned().unwrap_or_default();
                    let state = if s.up {
                        "up"
                    } else if l.cfg.kind() == "vhost-user" {
                        "waiting"
                    } else {
                        "down"
                    };
                    (
                        l.id,
                        PortInfo {
                            name: name.clone(),
                            kind: l.cfg.kind().into(),
                            state: state.into(),
                            detail: with_vlan(&l.detail, &l.cfg),
                            counters: counters(&s),
                            error: s.last_error.clone(),
                            queues: s.queues.iter().map(counters).collect(),
                        },
                    )
                })
                .collect();
            let names = g.ports.iter().map(|(n, l)| (l.id, n.clone())).collect();
            (rows, names)
        };
        rows.sort_by_key(|r| r.0);
        let macs = self
            .dp
            .macs()
            .into_iter()
            .map(|e| ctl::MacInfo {
                vlan: e.vlan,
                mac: fmt_mac(e.mac),
                port: names
                    .get(&e.port)
                    .cloned()
                    .unwrap_or_else(|| e.port.to_string()),
                age_secs: e.age.as_secs_f64(),
            })
            .collect();
        let uptime = self.started.elapsed().as_secs_f64();
        let workers = self
            .dp
            .workers()
            .into_iter()
            .map(|w| {
                let cpu_secs = u32::try_from(w.tid)
                    .ok()
                    .and_then(crate::proc::thread_cpu_time)
                    .map_or(0.0, |d| d.as_secs_f64());
                ctl::WorkerRow {
                    worker: w.index,
                    cpu: w.cpu,
                    cpu_secs,
                    busy_pct: if uptime > 0.0 {
                        100.0 * cpu_secs / uptime
                    } else {
                        0.0
                    },
                    ports: w
                        .ports
                        .iter()
                        .map(|id| names.get(id).cloned().unwrap_or_else(|| id.to_string()))
                        .collect(),
                    handoff_out: w.handoff_out,
                    handoff_in: w.handoff_in,
                    load_pct: 100.0 * w.busy,
                    #[allow(clippy::cast_precision_loss)]
                    busy_secs: w.busy_ns as f64 / 1e9,
                    moved_in: w.moved_in,
                    moved_out: w.moved_out,
                }
            })
            .collect();
        ctl::Status {
            uptime_secs: uptime,
            ports: rows.into_iter().map(|r| r.1).collect(),
            macs,
            workers,
        }
    }

    /// Stops every vhost-user port's thread (frontends see the backend go) and waits.
    pub(crate) fn stop_all(&self) {
        let mut g = self.lock();
        for l in g.ports.values_mut() {
            if let Running::Vhost { stop, .. } = &l.run {
                stop.set();
            }
        }
        for l in g.ports.values_mut() {
            if let Running::Vhost { thread, .. } = &mut l.run {
                if let Some(t) = thread.take() {
                    if t.join().is_err() {
                        warn!(port = %l.cfg.name(), "a port thread panicked");
                    }
                }
            }
        }
    }

    /// Answers a control request that changes something.
    pub(crate) fn apply(&self, op: &ctl::Op, reload: &dyn Fn() -> Result<Vec<String>>) -> Reply {
        let info = |name: &str| self.status().ports.into_iter().find(|p| p.name == name);
        match op {
            ctl::Op::Status => Reply::refused("status is answered by the server"),
            ctl::Op::PortAdd { spec } => {
                match parse_port_spec(spec).and_then(|p| {
                    let name = p.name().to_string();
                    self.add(p, Origin::Ctl).map(|new| (new, name))
                }) {
                    Ok((new, name)) => Reply {
                        port: info(&name),
                        ..Reply::done(if new { "added" } else { "exists" })
                    },
                    Err(e) => Reply::refused(e.to_string()),
                }
            }
            ctl::Op::PortDel { name } => match self.del(name) {
                Some(p) => Reply {
                    port: Some(p),
                    ..Reply::done("deleted")
                },
                None => Reply {
                    notes: vec![format!("no port {name}: nothing to delete")],
                    ..Reply::done("absent")
                },
            },
            ctl::Op::PortSet { name, set } => match self.set(name, set) {
                Ok(notes) => Reply {
                    result: Some(
                        if notes.is_empty() {
                            "unchanged"
                        } else {
                            "changed"
                        }
                        .into(),
                    ),
                    notes,
                    port: info(name),
                    ..Reply::done("changed")
                },
                Err(e) => Reply::refused(e.to_string()),
            },
            ctl::Op::PortMove { name, worker } => {
                let id = self.lock().ports.get(name).map(|l| l.id);
                match id.map(|id| self.dp.move_port(id, *worker)) {
                    None => Reply::refused(format!("no port {name}")),
                    Some(Ok(from)) if from == *worker => Reply {
                        port: info(name),
                        notes: vec![format!("{name} is on worker {from} already")],
                        ..Reply::done("unchanged")
                    },
                    Some(Ok(from)) => Reply {
                        port: info(name),
                        notes: vec![format!("{name}: worker {from} -> {worker}")],
                        ..Reply::done("moved")
                    },
                    Some(Err(e)) => Reply::refused(e.to_string()),
                }
            }
            ctl::Op::Reload => match reload() {
                Ok(notes) => Reply {
                    notes,
                    ..Reply::done("reloaded")
                },
                Err(e) => Reply::refused(e.to_string()),
            },
        }
    }
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

/// Writes `f` as TOML to `path` through a temporary file and a rename.
fn write_atomic(path: &Path, f: &FileConfig) -> std::io::Result<()> {
    let text = format!(
        "# Ports added to pvnet switch at runtime (pvnet ctl port add); rewritten by pvnet.\n{}",
        toml::to_string(f).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
    );
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
