//! Backend side: one control session per frontend connection.
//!
//! The session answers vhost-user messages on its own thread and owns the vring *configuration*
//! (sizes, addresses, fds, the memory table). When a ring becomes runnable (kick fd received
//! and, with `VHOST_USER_F_PROTOCOL_FEATURES`, enabled) it builds a validated
//! [`DeviceQueue`] and hands it to the dataplane through [`DeviceHooks::start_queue`]; from then
//! on the dataplane thread alone touches the ring. `GET_VRING_BASE` and disable take the ring
//! back synchronously ([`DeviceHooks::stop_queue`]) and report where it stopped.
//!
//! A frontend that disconnects or dies only ends its own session: its queues are stopped, its
//! port is removed and its memory unmapped once the dataplane lets go of the table.
//!
//! With `VIRTIO_F_ACCESS_PLATFORM` the session also keeps the IOTLB: the master copy of what
//! the frontend granted ([`virtq::Iotlb`]), changed by `VHOST_USER_IOTLB_MSG`, and handed to
//! the queues as an immutable snapshot ([`MemTable::granted`]) after every change, the same
//! way a new memory table is. The queues ask for what they miss on the backend channel
//! ([`BackendChannel`]).

use crate::eventfd::{Notifier, Stop};
use crate::features::{
    DEVICE_FEATURES, VHOST_F_LOG_ALL, VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM,
    VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC, VIRTIO_F_IN_ORDER, VIRTIO_F_RING_PACKED,
    VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use crate::iotlb::{
    BackendChannel, IotlbMsg, Kind, HDR_LEN, HDR_NEED_REPLY, HDR_REPLY, HDR_VERSION,
};
use crate::mmap::{map_regions, PeerRegion};
use crate::ratelimit::PeerLog;
use crate::{peer_error, peer_warn};
use std::fs::File;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserShMemConfig, VhostUserSharedMsg,
    VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    BackendReqHandler, Error as VuError, GpuBackend, Result as VuResult,
    VhostUserBackendReqHandlerMut, VhostUserProtocolFeatures,
};
use virtq::mem::AddrSpace;
use virtq::queue::{DeviceQueue, Direction, Format, QueueConfig, RingAddrs};
use virtq::{DirtyLog, Grant, Iotlb, MemTable, Perm};

/// Identifies a frontend connection (a switch port) for the life of the backend process.
pub type PortId = u32;

/// A queue ready to run, handed to the dataplane.
#[derive(Debug)]
pub struct StartedQueue {
    /// vhost-user queue index (even: receive, odd: transmit).
    pub index: u16,
    /// The validated ring.
    pub queue: DeviceQueue,
    /// Kick eventfd; `None` when the frontend polls (`VHOST_USER_VRING_NOFD_MASK`).
    pub kick: Option<Notifier>,
    /// Call eventfd; `None` when the frontend polls.
    pub call: Option<Notifier>,
    /// Error eventfd, signalled when the queue is stopped for a violation.
    pub err: Option<Notifier>,
    /// `VIRTIO_NET_F_MRG_RXBUF` negotiated: a received packet may span several chains.
    pub mergeable: bool,
    /// Every feature the frontend acked (offloads decide what it may be sent).
    pub features: u64,
    /// With `VIRTIO_F_ACCESS_PLATFORM`: where to ask for a translation the queue misses.
    pub iotlb: Option<Arc<BackendChannel>>,
}

/// What the dataplane provides to the control plane. Called from session threads.
pub trait DeviceHooks: Send + Sync + 'static {
    /// A frontend connected and was given `port`.
    fn port_connected(&self, port: PortId);
    /// A queue is runnable: the dataplane takes ownership.
    fn start_queue(&self, port: PortId, q: StartedQueue);
    /// Stops a running queue and returns its next avail index (None if it was not running).
    /// Must not return before the dataplane has let go of the ring.
    fn stop_queue(&self, port: PortId, index: u16) -> Option<u16>;
    /// The memory table (or the IOTLB snapshot) changed while queues may be running. With
    /// `wait`, must not return before every running queue of the port has switched to `mem`:
    /// after an IOTLB invalidation (or a new table) the frontend is told (acked) only then,
    /// and may reuse the range. A grant added needs no wait: a queue that looks before it
    /// switches finds a retryable miss and tries again after it has.
    fn set_mem(&self, port: PortId, mem: Arc<MemTable>, wait: bool);
    /// The frontend is gone: every queue of the port is already stopped.
    fn port_gone(&self, port: PortId);
    /// The guest with address `mac` is behind `port` now (`SEND_RARP`, after a migration).
    fn announce(&self, _port: PortId, _mac: [u8; 6]) {}
}

/// A port's offer as its listener or connector holds it: each new session reads it when the
/// frontend connects, so a change (`pvnet ctl port set ... offloads=false`) applies from the
/// frontend's next connection (features are negotiated once per connection).
pub type SharedConfig = Arc<Mutex<BackendConfig>>;

/// Backend configuration shared by every session.
#[derive(Debug, Clone, Copy)]
pub struct BackendConfig {
    /// Queue pairs offered (`GET_QUEUE_NUM`).
    pub queue_pairs: u16,
    /// Largest queue size accepted.
    pub max_queue_size: u16,
    /// Memory slots offered (`GET_MAX_MEM_SLOTS`).
    pub mem_slots: u64,
    /// virtio features offered (`GET_FEATURES`).
    pub features: u64,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            queue_pairs: 1,
            max_queue_size: 32768,
            mem_slots: 32,
            features: DEVICE_FEATURES,
        }
    }
}

impl BackendConfig {
    /// What `GET_FEATURES` answers: `features`, and `VIRTIO_NET_F_MQ` when more than one
    /// pair is offered (QEMU passes MQ to the guest only if the backend has it; DPDK's
    /// virtio-user sets up more than one pair only then).
    pub fn offered(&self) -> u64 {
        if self.queue_pairs > 1 {
            self.features | VIRTIO_NET_F_MQ
        } else {
            self.features
        }
    }
}

#[derive(Debug, Default)]
struct Vring {
    num: u16,
    addrs: Option<RingAddrs>,
    base: u16,
    kick: Option<Option<File>>,
    call: Option<File>,
    err: Option<File>,
    enabled: bool,
    running: bool,
}

#[derive(Debug)]
struct Region {
    gpa: u64,
    len: u64,
    uaddr: u64,
    mmap_offset: u64,
    file: File,
    /// `ADD_MEM_REG`s of this very region not yet removed. QEMU (7.2) runs one vhost device
    /// per queue pair over the same connection and each adds (and removes) every region:
    /// the second add of a region is the same memory, not an overlap.
    adds: u32,
}

impl Region {
    fn same(&self, r: &VhostUserSingleMemoryRegion) -> bool {
        (self.gpa, self.len, self.uaddr, self.mmap_offset)
            == (r.guest_phys_addr, r.memory_size, r.user_addr, r.mmap_offset)
    }
}

/// The vhost-user state of one frontend connection.
pub struct Session {
    port: PortId,
    cfg: BackendConfig,
    hooks: Arc<dyn DeviceHooks>,
    acked: u64,
    protocol: u64,
    vrings: Vec<Vring>,
    regions: Vec<Region>,
    /// The shared-memory table.
    base: Option<Arc<MemTable>>,
    /// What the queues translate through: `base`, or under `VIRTIO_F_ACCESS_PLATFORM` the
    /// snapshot of `iotlb` over it.
    mem: Option<Arc<MemTable>>,
    /// What the frontend granted (`VIRTIO_F_ACCESS_PLATFORM`).
    iotlb: Iotlb,
    /// The backend request channel (`SET_BACKEND_REQ_FD`).
    channel: Arc<BackendChannel>,
    /// The listener's bound on the warnings its frontends can cause.
    log: Arc<PeerLog>,
    /// The dirty log (`SET_LOG_BASE`); used while `VHOST_F_LOG_ALL` is acked.
    dirty: Option<Arc<DirtyLog>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("port", &self.port)
            .field("acked", &self.acked)
            .finish()
    }
}

fn invalid(what: &'static str) -> VuError {
    VuError::InvalidOperation(what)
}

/// Why a session refused a frontend's request. The cause is logged (with the port) where the
/// request is answered; the frontend sees the vhost-user error code.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A queue index past the queues this device has.
    #[error("no queue {index} (the device has {count})")]
    NoSuchQueue {
        /// The index asked for.
        index: u32,
        /// Queues the device has.
        count: usize,
    },
    /// Features acked that were not offered.
    #[error("features {acked:#x} acked, only {offered:#x} offered")]
    UnofferedFeatures {
        /// What the frontend acked.
        acked: u64,
        /// What we offered.
        offered: u64,
    },
    /// A ring size that is not a power of two or above the largest accepted.
    #[error("queue {index}: size {num} (a power of two up to {max})")]
    BadQueueSize {
        /// The queue.
        index: u32,
        /// The size asked for.
        num: u32,
        /// The largest accepted.
        max: u32,
    },
    /// A value that does not fit its field.
    #[error("{what} {value} out of range")]
    OutOfRange {
        /// Which value.
        what: &'static str,
        /// The value given.
        value: u32,
    },
    /// More memory regions than the slots offered.
    #[error("memory regions full ({max} slots)")]
    TooManyRegions {
        /// Slots offered.
        max: u64,
    },
    /// Removing a region that was never added.
    #[error("no memory region at {gpa:#x}+{len:#x}")]
    NoSuchRegion {
        /// Its guest address.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// A ring the frontend set up cannot run (addresses, size, memory): the virtqueue's own
    /// reason.
    #[error("queue {index} cannot start: {source}")]
    Queue {
        /// The queue.
        index: u16,
        /// What the ring layer found.
        #[source]
        source: virtq::Error,
    },
}

/// Logs (within `log`'s limit) why a request of `port`'s frontend is refused and gives the
/// frontend its error code.
fn refuse(log: &PeerLog, port: PortId, e: SessionError) -> VuError {
    peer_warn!(log, port, "request refused: {e}");
    VuError::InvalidParam
}

impl Session {
    /// [`refuse`] for this session's port.
    fn refuse(&self, e: SessionError) -> VuError {
        refuse(&self.log, self.port, e)
    }

    /// `value` as a u16, or the request is refused.
    fn fits_u16(&self, what: &'static str, value: u32) -> VuResult<u16> {
        u16::try_from(value).map_err(|_| self.refuse(SessionError::OutOfRange { what, value }))
    }
}

fn io_err(e: std::io::Error) -> VuError {
    VuError::ReqHandlerError(e)
}

impl Session {
    /// A fresh session for `port`; the warnings its frontend causes count against `log`.
    pub fn new(
        port: PortId,
        cfg: BackendConfig,
        hooks: Arc<dyn DeviceHooks>,
        log: Arc<PeerLog>,
    ) -> Self {
        let n = usize::from(cfg.queue_pairs) * 2;
        Self {
            port,
            cfg,
            hooks,
            acked: 0,
            protocol: 0,
            vrings: (0..n).map(|_| Vring::default()).collect(),
            regions: Vec::new(),
            base: None,
            mem: None,
            iotlb: Iotlb::new(MAX_GRANTS),
            channel: Arc::new(BackendChannel::default()),
            dirty: None,
            log,
        }
    }

    fn iommu(&self) -> bool {
        self.acked & VIRTIO_F_ACCESS_PLATFORM != 0
    }

    /// Hands the queues what they translate through now: the shared-memory table, or under
    /// an IOMMU the snapshot of the grants over it. Returns only after every running queue
    /// switched (see [`DeviceHooks::set_mem`]), then starts the rings that were waiting for
    /// memory (or for a grant of their own addresses).
    fn publish(&mut self, wait: bool) -> VuResult<()> {
        let Some(base) = self.base.clone() else {
            return Ok(());
        };
        let mut mem = if self.iommu() {
            let t = MemTable::granted(&base, self.iotlb.iter())
                .map_err(|e| io_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
            Arc::new(t)
        } else {
            base
        };
        if let Some(d) = self
            .dirty
            .clone()
            .filter(|_| self.acked & VHOST_F_LOG_ALL != 0)
        {
            mem = Arc::new(MemTable::with_log(&mem, d));
        }
        if self.vrings.iter().any(|v| v.running) {
            self.hooks.set_mem(self.port, mem.clone(), wait);
        }
        self.mem = Some(mem);
        // A ring set up before the memory table (the protocol does not order them), or whose
        // addresses were not granted yet, starts now.
        for i in 0..self.vrings.len() {
            if let Ok(i) = u16::try_from(i) {
                self.maybe_start(i)?;
            }
        }
        Ok(())
    }

    /// `VHOST_USER_IOTLB_MSG`: a grant or a revocation. Anything else (the feature not
    /// negotiated, a type only the backend sends, no or unknown access bits, a range that
    /// wraps or names memory the frontend did not share, more grants than the bound) is a
    /// violation: the session ends, and with it only this port.
    ///
    /// An invalidation takes effect before the ack: [`Self::publish`] returns only when every
    /// running queue has switched to the snapshot without the range, and a queue switches
    /// only between batches (the worker runs commands between batches), so no access to the
    /// range is in progress or can start once the frontend hears back.
    ///
    /// Applies `m` to the master map only; the caller publishes once for a run of messages
    /// ([`take_iotlb_run`]). Returns `None` if nothing changed, else whether anything may
    /// have been revoked (the publish must then wait for the queues).
    fn iotlb_msg(&mut self, m: IotlbMsg) -> Result<Option<bool>, String> {
        if !self.iommu() {
            return Err("IOTLB message without VIRTIO_F_ACCESS_PLATFORM".into());
        }
        let revoked = match m.kind {
            Kind::Update => {
                let perm = Perm::from_bits(m.perm)
                    .ok_or_else(|| format!("update with access bits {:#x}", m.perm))?;
                let base = self.base.as_ref().ok_or("update before the memory table")?;
                if !base.covers_user(m.uaddr, m.size) {
                    return Err(format!(
                        "update of {:#x}+{:#x} names user address {:#x}, outside shared memory",
                        m.iova, m.size, m.uaddr
                    ));
                }
                self.iotlb
                    .update(Grant {
                        iova: m.iova,
                        len: m.size,
                        uaddr: m.uaddr,
                        perm,
                    })
                    .map_err(|e| format!("update of {:#x}+{:#x}: {e}", m.iova, m.size))?;
                // An update may replace an older grant of the same range: a revocation too.
                false
            }
            Kind::Invalidate => {
                if !self.iotlb.invalidate(m.iova, m.size) {
                    return Ok(None); // nothing granted there: nothing changes
                }
                true
            }
            Kind::Miss | Kind::AccessFail => {
                return Err(format!("{:?} is a backend's message", m.kind));
            }
        };
        debug!(port = self.port, kind = ?m.kind, iova = format_args!("{:#x}", m.iova),
            size = m.size, grants = self.iotlb.len(), "IOTLB");
        Ok(Some(revoked))
    }

    fn vring(&mut self, index: u32) -> VuResult<&mut Vring> {
        let count = self.vrings.len();
        if index as usize >= count {
            return Err(self.refuse(SessionError::NoSuchQueue { index, count }));
        }
        Ok(&mut self.vrings[index as usize])
    }

    fn remap(&mut self) -> VuResult<()> {
        self.map_regions()?;
        // Grants of memory no longer shared are dropped (every grant is checked against the
        // table when it arrives); the frontend grants again on a miss.
        if let Some(base) = self.base.clone() {
            let dropped = self.iotlb.retain(|g| base.covers_user(g.uaddr, g.len));
            if dropped > 0 {
                info!(
                    port = self.port,
                    dropped, "grants outside the new memory table dropped"
                );
            }
        }
        self.publish(true)
    }

    fn map_regions(&mut self) -> VuResult<()> {
        let regions = self
            .regions
            .iter()
            .map(|r| {
                Ok(PeerRegion {
                    gpa: r.gpa,
                    len: r.len,
                    uaddr: r.uaddr,
                    mmap_offset: r.mmap_offset,
                    file: r.file.try_clone()?,
                })
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(io_err)?;
        let mem = map_regions(regions).map_err(|e| {
            peer_warn!(self.log, port = self.port, "memory table rejected: {e}");
            io_err(e)
        })?;
        info!(port = self.port, regions = mem.len(), "memory table mapped");
        if let Some(d) = &self.dirty {
            self.dirty = Some(Arc::new(d.with_shared(mem.shared_ranges())));
        }
        self.base = Some(mem);
        Ok(())
    }

    /// Starts the ring if it has everything it needs (spec: kick received, and enabled when
    /// protocol features were negotiated).
    fn maybe_start(&mut self, index: u16) -> VuResult<()> {
        let proto = self.acked & VHOST_USER_F_PROTOCOL_FEATURES != 0;
        let event_idx = self.acked & VIRTIO_F_EVENT_IDX != 0;
        let indirect = self.acked & VIRTIO_F_INDIRECT_DESC != 0;
        let mergeable = self.acked & VIRTIO_NET_F_MRG_RXBUF != 0;
        let in_order = self.acked & VIRTIO_F_IN_ORDER != 0;
        let format = if self.acked & VIRTIO_F_RING_PACKED != 0 {
            Format::Packed
        } else {
            Format::Split
        };
        let port = self.port;
        let log = self.log.clone();
        let Some(mem) = self.mem.clone() else {
            debug!(
                port,
                queue = index,
                "no memory table yet: the ring starts when it arrives"
            );
            return Ok(());
        };
        let v = self.vring(u32::from(index))?;
        if v.running || v.kick.is_none() || (proto && !v.enabled) {
            return Ok(());
        }
        let Some(addrs) = v.addrs else { return Ok(()) };
        if v.num == 0 {
            debug!(port, queue = index, "size 0: ring left stopped");
            return Ok(());
        }
        let cfg = QueueConfig {
            format,
            size: v.num,
            addrs,
            space: AddrSpace::User,
            base: v.base,
            event_idx,
            indirect,
            in_order,
            direction: if index.is_multiple_of(2) {
                Direction::DeviceWrites
            } else {
                Direction::DeviceReads
            },
        };
        let mut queue = match DeviceQueue::new(mem, &cfg) {
            Ok(q) => q,
            // Under an IOMMU, a ring not granted yet: ask, and start when the grant arrives.
            Err(virtq::Error::TranslationMiss { addr, perm, .. }) => {
                debug!(
                    port,
                    queue = index,
                    addr = format_args!("{addr:#x}"),
                    "ring not granted yet: asking"
                );
                self.channel.miss(addr, perm);
                return Ok(());
            }
            Err(source) => {
                return Err(refuse(&log, port, SessionError::Queue { index, source }));
            }
        };
        if let Some((base, used)) = queue.resume_from_used() {
            peer_warn!(
                log,
                port,
                queue = index,
                base,
                used,
                "ring base and used index differ (the previous backend stopped without GET_VRING_BASE: killed or restarted): resuming from the used index; chains in flight then go again"
            );
        }
        let iommu = self.iommu();
        let channel = self.channel.clone();
        let v = self.vring(u32::from(index))?;
        let dup = |f: &Option<File>| -> VuResult<Option<Notifier>> {
            f.as_ref()
                .map(|f| {
                    let n = Notifier::from_file(f.try_clone()?);
                    n.set_nonblocking()?;
                    Ok(n)
                })
                .transpose()
                .map_err(io_err)
        };
        let kick = dup(v.kick.as_ref().unwrap_or(&None))?;
        let call = dup(&v.call)?;
        let err = dup(&v.err)?;
        v.running = true;
        info!(
            port,
            queue = index,
            size = cfg.size,
            base = cfg.base,
            event_idx,
            "queue started"
        );
        self.hooks.start_queue(
            port,
            StartedQueue {
                index,
                queue,
                kick,
                call,
                err,
                mergeable,
                features: self.acked,
                iotlb: iommu.then_some(channel),
            },
        );
        Ok(())
    }

    fn stop(&mut self, index: u16) -> VuResult<u16> {
        let port = self.port;
        let v = self.vring(u32::from(index))?;
        if v.running {
            v.running = false;
            if let Some(base) = self.hooks.stop_queue(port, index) {
                let v = self.vring(u32::from(index))?;
                v.base = base;
                debug!(port, queue = index, base, "queue stopped");
            }
        }
        Ok(self.vring(u32::from(index))?.base)
    }

    fn stop_all(&mut self) {
        for i in 0..self.vrings.len() {
            let _ = self.stop(u16::try_from(i).unwrap_or(u16::MAX));
        }
    }
}

impl VhostUserBackendReqHandlerMut for Session {
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.stop_all();
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        self.stop_all();
        for v in &mut self.vrings {
            *v = Vring::default();
        }
        self.acked = 0;
        self.iotlb = Iotlb::new(MAX_GRANTS);
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(self.cfg.offered())
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        let offered = self.cfg.offered();
        if features & !offered != 0 {
            return Err(self.refuse(SessionError::UnofferedFeatures {
                acked: features,
                offered,
            }));
        }
        let was = self.acked;
        self.acked = features;
        info!(
            port = self.port,
            features = format_args!("{features:#x}"),
            "features acked"
        );
        // Live migration starts (or ends): the queues switch to a table that marks (or not)
        // every page they write, before the frontend hears back.
        if (was ^ features) & VHOST_F_LOG_ALL != 0 {
            let on = features & VHOST_F_LOG_ALL != 0;
            info!(
                port = self.port,
                on,
                log_mapped = self.dirty.is_some(),
                pages_marked = self.dirty.as_ref().map_or(0, |d| d.marked()),
                "dirty logging (live migration)"
            );
            self.publish(true)?;
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<Vec<u64>>> {
        self.regions = ctx
            .iter()
            .zip(files)
            .map(|(r, file)| Region {
                gpa: r.guest_phys_addr,
                len: r.memory_size,
                uaddr: r.user_addr,
                mmap_offset: r.mmap_offset,
                file,
                adds: 1,
            })
            .collect();
        self.remap()?;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        let max = u32::from(self.cfg.max_queue_size);
        self.vring(index)?;
        // 0 is accepted and leaves the ring unable to start: DPDK virtio-user sends
        // SET_VRING_NUM 0 (then its address and kick) for queues of its device that the
        // application did not set up (e.g. `queues=2` with one testpmd queue); DPDK's vhost
        // library accepts that (0 passes its power-of-two check), refusing it ends the session.
        if num > max || (num != 0 && !num.is_power_of_two()) {
            return Err(self.refuse(SessionError::BadQueueSize { index, num, max }));
        }
        let num = self.fits_u16("queue size", num)?;
        self.vring(index)?.num = num;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        let v = self.vring(index)?;
        v.addrs = Some(RingAddrs {
            desc: descriptor,
            avail: available,
            used,
        });
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        // Packed ring: bits 0-14 the next avail slot, bit 15 its wrap counter; QEMU adds the
        // used slot and wrap in bits 16-31. pvnet's device restarts with every buffer before
        // the base returned (it completes or gives back every chain before it stops), so the
        // used half equals the avail half and only the avail half is kept (as DPDK does).
        let base = if self.acked & VIRTIO_F_RING_PACKED != 0 {
            (base & 0xffff) as u16
        } else {
            self.fits_u16("ring base", base)?
        };
        self.vring(index)?.base = base;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        let i = self.fits_u16("queue index", index)?;
        let base = self.stop(i)?;
        // The ring is stopped; a new SET_VRING_KICK starts it again.
        self.vring(index)?.kick = None;
        // Packed ring: the used half (bits 16-31, QEMU reads it) is the avail half: every
        // buffer before the base has been returned.
        let num = if self.acked & VIRTIO_F_RING_PACKED != 0 {
            u32::from(base) | u32::from(base) << 16
        } else {
            u32::from(base)
        };
        Ok(VhostUserVringState::new(index, num))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = u16::from(index);
        self.stop(i)?;
        self.vring(u32::from(index))?.kick = Some(fd);
        self.maybe_start(i)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = u16::from(index);
        let was_running = self.vring(u32::from(index))?.running;
        // Swap the fd with the ring stopped, then resume where it was.
        self.stop(i)?;
        self.vring(u32::from(index))?.call = fd;
        if was_running {
            self.maybe_start(i)?;
        }
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?.err = fd;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        // BACKEND_REQ carries the IOTLB misses; QEMU requires it and REPLY_ACK for an IOMMU.
        // LOG_SHMFD: the dirty log of live migration; RARP: the destination announces the
        // guest's address (`SEND_RARP`) so the switch relearns where it is.
        Ok(VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::RARP)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        self.protocol = features;
        info!(
            port = self.port,
            protocol = format_args!("{features:#x}"),
            "protocol features acked"
        );
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(u64::from(self.cfg.queue_pairs))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        let i = self.fits_u16("queue index", index)?;
        if enable {
            self.vring(index)?.enabled = true;
            self.maybe_start(i)
        } else {
            self.stop(i)?;
            self.vring(index)?.enabled = false;
            Ok(())
        }
    }

    fn get_config(&mut self, _o: u32, _s: u32, _f: VhostUserConfigFlags) -> VuResult<Vec<u8>> {
        Err(invalid("GET_CONFIG not offered"))
    }

    fn set_config(&mut self, _o: u32, _b: &[u8], _f: VhostUserConfigFlags) -> VuResult<()> {
        Err(invalid("SET_CONFIG not offered"))
    }

    fn set_gpu_socket(&mut self, _g: GpuBackend) -> VuResult<()> {
        Err(invalid("not a GPU device"))
    }

    fn get_shared_object(&mut self, _u: VhostUserSharedMsg) -> VuResult<File> {
        Err(invalid("shared objects not offered"))
    }

    fn get_inflight_fd(&mut self, _i: &VhostUserInflight) -> VuResult<(VhostUserInflight, File)> {
        Err(invalid("inflight fd not offered"))
    }

    fn set_inflight_fd(&mut self, _i: &VhostUserInflight, _f: File) -> VuResult<()> {
        Err(invalid("inflight fd not offered"))
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        Ok(self.cfg.mem_slots)
    }

    fn add_mem_region(
        &mut self,
        r: &VhostUserSingleMemoryRegion,
        file: File,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<u64>> {
        if let Some(x) = self.regions.iter_mut().find(|x| x.same(r)) {
            x.adds += 1;
            debug!(
                port = self.port,
                gpa = format_args!("{:#x}", { r.guest_phys_addr }),
                adds = x.adds,
                "region added again (one vhost device per queue pair): kept as it is"
            );
            return Ok(None);
        }
        if self.regions.len() as u64 >= self.cfg.mem_slots {
            return Err(self.refuse(SessionError::TooManyRegions {
                max: self.cfg.mem_slots,
            }));
        }
        self.regions.push(Region {
            gpa: r.guest_phys_addr,
            len: r.memory_size,
            uaddr: r.user_addr,
            mmap_offset: r.mmap_offset,
            file,
            adds: 1,
        });
        if let Err(e) = self.remap() {
            self.regions.pop();
            return Err(e);
        }
        Ok(None)
    }

    fn remove_mem_region(&mut self, r: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        // A region added more than once goes when its last add is removed.
        if let Some(x) = self
            .regions
            .iter_mut()
            .find(|x| x.gpa == r.guest_phys_addr && x.len == r.memory_size && x.adds > 1)
        {
            x.adds -= 1;
            return Ok(());
        }
        let before = self.regions.len();
        self.regions
            .retain(|x| !(x.gpa == r.guest_phys_addr && x.len == r.memory_size));
        if self.regions.len() == before {
            return Err(self.refuse(SessionError::NoSuchRegion {
                gpa: r.guest_phys_addr,
                len: r.memory_size,
            }));
        }
        if self.regions.is_empty() {
            self.mem = None;
            return Ok(());
        }
        self.remap()
    }

    fn set_device_state_fd(
        &mut self,
        _d: VhostTransferStateDirection,
        _p: VhostTransferStatePhase,
        _f: File,
    ) -> VuResult<Option<File>> {
        Err(invalid("device state transfer not offered"))
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        Err(invalid("device state transfer not offered"))
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        Err(invalid("shared memory regions not offered"))
    }

    /// The dirty log: `mmap_size` bytes of bitmap at `mmap_offset` of the fd (one bit per
    /// 4 KiB guest page, `VHOST_USER_PROTOCOL_F_LOG_SHMFD`). A new one replaces the old (QEMU
    /// resizes it with the guest's memory); the queues switch to it before the reply.
    fn set_log_base(&mut self, l: &VhostUserLog, f: File) -> VuResult<()> {
        let base = self
            .base
            .clone()
            .ok_or(invalid("SET_LOG_BASE before the memory table"))?;
        let len = usize::try_from(l.mmap_size).map_err(|_| invalid("dirty log too large"))?;
        let m = crate::mmap::Mapping::new(f, l.mmap_offset, l.mmap_size).map_err(io_err)?;
        let start = m.start();
        // SAFETY: `start .. start + len` is the mapping just made, kept alive by the log.
        let log = unsafe { DirtyLog::new(start, len, base.shared_ranges(), Arc::new(m)) };
        info!(
            port = self.port,
            bytes = len,
            covers_gib = len as f64 * 8.0 * 4096.0 / f64::from(1u32 << 30),
            "dirty log mapped"
        );
        self.dirty = Some(Arc::new(log));
        if self.acked & VHOST_F_LOG_ALL != 0 {
            self.publish(true)?;
        }
        Ok(())
    }
}

/// Runs one session to its end on the calling thread: answers messages until the frontend
/// disconnects or breaks the protocol, then stops the port's queues and tells the dataplane.
/// The warnings the frontend causes count against `log` (one per listener: see
/// [`crate::ratelimit`]).
pub fn run_session(
    stream: UnixStream,
    port: PortId,
    cfg: BackendConfig,
    hooks: Arc<dyn DeviceHooks>,
    log: Arc<PeerLog>,
) {
    hooks.port_connected(port);
    let session = Arc::new(Mutex::new(Session::new(
        port,
        cfg,
        hooks.clone(),
        log.clone(),
    )));
    let peek = stream.try_clone().ok();
    let mut handler = BackendReqHandler::from_stream(stream, session.clone());
    loop {
        if let Some(sock) = &peek {
            match take_own_message(sock, &session) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    peer_error!(log, port, "closing session: {e}");
                    break;
                }
            }
        }
        match handler.handle_request() {
            Ok(()) => {}
            Err(VuError::Disconnected | VuError::PartialMessage | VuError::SocketBroken(_)) => {
                info!(port, "frontend disconnected");
                break;
            }
            Err(e) => {
                peer_error!(log, port, "closing session: {e}");
                break;
            }
        }
    }
    if let Ok(mut s) = session.lock() {
        s.stop_all();
        s.mem = None;
        s.base = None;
    }
    // The connection ends here for the frontend too, whoever else holds a copy of the fd (the
    // listener keeps one to end a silent session at a stop, and reaps it only when it next
    // wakes).
    if let Some(sock) = &peek {
        let _ = sock.shutdown(std::net::Shutdown::Both);
    }
    hooks.port_gone(port);
}

/// `VHOST_USER_SET_LOG_FD` (request 7): not dispatched by the crate.
const SET_LOG_FD: u32 = 7;

/// Reads a message carrying exactly one fd and a body of 0 or 8 bytes (`what` names it in
/// errors).
fn recv_one_fd(sock: &UnixStream, what: &str, size: usize) -> std::io::Result<File> {
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    if size != 0 && size != 8 {
        return Err(bad(format!("{what} of {size} bytes")));
    }
    let mut m = [0u8; HDR_LEN + 8];
    let mut iov = [libc::iovec {
        iov_base: m.as_mut_ptr().cast(),
        iov_len: HDR_LEN + size,
    }];
    // Room for as many fds as a vhost-user message may carry: with room for one,
    // vmm-sys-util's `recv_with_fd` leaks a second fd the kernel fits into the cmsg
    // buffer's alignment padding (found by the vhost_msg fuzz target).
    let mut raw = [-1; 32];
    // SAFETY: the iovec points at `m`, valid for writes of the length given.
    let (got, n) = unsafe { sock.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    // SAFETY: the first `n` entries are fds just received, owned by nothing else.
    let mut files: Vec<File> = raw[..n]
        .iter()
        .map(|&fd| unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        .collect();
    if got != HDR_LEN + size {
        return Err(bad(format!("{what} cut short")));
    }
    if files.len() != 1 {
        return Err(bad(format!("{what} with {} fds", files.len())));
    }
    Ok(files.swap_remove(0))
}

/// `VHOST_USER_SEND_RARP` (request 19): after a migration, the destination's frontend gives
/// the guest's MAC address; the crate does not dispatch it.
const SEND_RARP: u32 = 19;

/// `VHOST_USER_SET_VRING_ENABLE` (request 18) on the wire: a 12-byte header (request, flags,
/// size) and a `vhost_vring_state` body (index, num), no fds.
const SET_VRING_ENABLE: u32 = 18;
const VRING_STATE_LEN: usize = 8;

/// Handles a `SET_VRING_ENABLE` that arrives before `SET_FEATURES` acked
/// `VHOST_USER_F_PROTOCOL_FEATURES`, which the `vhost` crate refuses (`InactiveFeature`, which
/// ends the session) before our handler sees it.
///
/// QEMU's vhost-user-net sends exactly that: it checks the *offered* features
/// (`vhost_user_set_vring_enable`: `virtio_has_feature(dev->features, PROTOCOL_FEATURES)`), and
/// sends `SET_VRING_ENABLE(1)` when the guest writes its features (`virtio_net_set_features` ->
/// `peer_attach`) and again from `vhost_net_start` ("restore vring enable state"), which in
/// QEMU 7.2 runs *before* `vhost_net_start_one` sends `SET_FEATURES` (seen with Debian's 7.2:
/// five enables, all before `SET_FEATURES`, none after). Ignoring these would leave
/// the rings disabled forever (with protocol features a ring starts disabled, vhost-user spec
/// "Ring states"); DPDK's vhost library and libvhost-user accept the message at any time. So
/// the enable state is recorded now and takes effect when the ring is otherwise ready.
///
/// Peeks (never consumes) the next message; only a complete `SET_VRING_ENABLE` seen while
/// protocol features are not acked is read here, applied, and acked if the frontend asked
/// (`NEED_REPLY` with `REPLY_ACK`). Returns `Ok(true)` if it handled a message.
fn take_early_vring_enable(sock: &UnixStream, session: &Mutex<Session>) -> std::io::Result<bool> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let protocol = match session.lock() {
        Ok(s) if s.acked & VHOST_USER_F_PROTOCOL_FEATURES == 0 => s.protocol,
        _ => return Ok(false),
    };
    let mut buf = [0u8; HDR_LEN + VRING_STATE_LEN];
    // A 20-byte message sent with one sendmsg arrives whole; still, wait a little for a body
    // that lags its header rather than hand a half-seen message to the crate.
    for attempt in 0..100 {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes. MSG_PEEK leaves the bytes
        // (and any fds attached to them) queued for `handle_request`.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK,
            )
        };
        // An error or EOF is for `handle_request` to report.
        let Ok(n) = usize::try_from(n) else {
            return Ok(false);
        };
        if n < HDR_LEN || le32(&buf, 0) != SET_VRING_ENABLE {
            return Ok(false);
        }
        if le32(&buf, 8) as usize != VRING_STATE_LEN {
            return Ok(false); // malformed: the crate rejects it
        }
        if n == buf.len() {
            break;
        }
        if attempt == 99 {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (&*sock).read_exact(&mut buf)?;
    let (flags, index, num) = (le32(&buf, 4), le32(&buf, 12), le32(&buf, 16));
    let res = match (num, session.lock()) {
        (0 | 1, Ok(mut s)) => {
            info!(
                port = s.port,
                queue = index,
                enable = num == 1,
                "SET_VRING_ENABLE before SET_FEATURES (QEMU vhost-user-net): recorded"
            );
            s.set_vring_enable(index, num == 1).is_ok()
        }
        _ => false,
    };
    reply_ack(sock, SET_VRING_ENABLE, flags, protocol, u64::from(!res))?;
    Ok(true)
}

/// Accepts frontends on a listening socket (server mode) until `stop` is set, one session
/// thread each. Returns after `max_sessions` sessions have come and gone, if given.
pub fn serve(
    path: &Path,
    cfg: BackendConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
    max_sessions: Option<u32>,
) -> std::io::Result<()> {
    let l = Listener::bind(path)?;
    serve_impl(
        l,
        Arc::new(Mutex::new(cfg)),
        hooks,
        stop,
        max_sessions,
        None,
    )
}

/// Like [`serve`] for one switch port, on a socket already bound ([`Listener::bind`]): every
/// frontend that connects gets `port`, one at a time (a second frontend is refused while one
/// is attached), until `stop` is set; then the attached frontend is disconnected and the
/// socket file removed.
pub fn serve_port(
    listener: Listener,
    port: PortId,
    cfg: SharedConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
) -> std::io::Result<()> {
    serve_impl(listener, cfg, hooks, stop, None, Some(port))
}

/// How long a switch port's new frontend waits for the previous one's session to finish
/// (a frontend that reconnects at once, as QEMU does, finds the old session still tearing
/// down) before it is refused.
const GRACE: Duration = Duration::from_millis(200);

/// Waits up to `grace` for finished sessions to leave fewer than `limit`; true once they do.
/// With `ending_only`, it waits only while some session is already ending (its socket shut
/// down or hung up: the session closed it, or the peer did): at the session limit a frontend
/// that connects right after others hung up is not refused for sessions still tearing down,
/// and sessions whose peers are all there cost no wait, so a flood past the limit is refused
/// at once. Without it, it waits out the grace (a switch port's frontend reconnecting).
fn sessions_below_within(
    sessions: &mut Vec<(std::thread::JoinHandle<()>, UnixStream)>,
    limit: usize,
    grace: Duration,
    ending_only: bool,
) -> bool {
    let until = std::time::Instant::now() + grace;
    loop {
        sessions.retain(|(t, _)| !t.is_finished());
        if sessions.len() < limit {
            return true;
        }
        if std::time::Instant::now() >= until
            || (ending_only && !sessions.iter().any(|(_, s)| hung_up(s)))
        {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether a session's socket is shut down or its peer hung up (a poll that does not wait).
fn hung_up(s: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a timeout of 0; the fd stays open for the call (borrowed).
    let n = unsafe { libc::poll(&raw mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

/// Grants one frontend may hold at once (IOTLB entries). A Linux guest in strict mode has one
/// per buffer in flight (a few thousand at most); a pool, a handful.
pub const MAX_GRANTS: usize = 8192;

/// Handles the messages the `vhost` crate does not dispatch, before it sees them:
/// `VHOST_USER_IOTLB_MSG`, `VHOST_USER_SET_BACKEND_REQ_FD` and `VHOST_USER_SET_LOG_FD` (with
/// their fds), `VHOST_USER_SEND_RARP`, and an early `SET_VRING_ENABLE` (see
/// [`take_early_vring_enable`]). Peeks the header; anything else is
/// left for the crate. Returns `Ok(true)` if it handled a message,
/// an error (which ends the session) for a malformed one or a violation.
fn take_own_message(sock: &UnixStream, session: &Mutex<Session>) -> std::io::Result<bool> {
    use crate::iotlb::{IOTLB_MSG, SET_BACKEND_REQ_FD};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let mut hdr = [0u8; HDR_LEN];
    // SAFETY: `hdr` is valid for writes of its length; MSG_PEEK leaves the bytes (and any fd
    // attached) queued.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            hdr.as_mut_ptr().cast(),
            hdr.len(),
            libc::MSG_PEEK,
        )
    };
    if usize::try_from(n).ok() != Some(HDR_LEN) {
        return Ok(false); // EOF, error or a lagging header: for the crate to report
    }
    let (request, flags, size) = (le32(&hdr, 0), le32(&hdr, 4), le32(&hdr, 8) as usize);
    let ok = match request {
        IOTLB_MSG => return take_iotlb_run(sock, session, size),
        SET_BACKEND_REQ_FD => {
            let file = recv_one_fd(sock, "SET_BACKEND_REQ_FD", size)?;
            if !std::os::unix::fs::FileTypeExt::is_socket(&file.metadata()?.file_type()) {
                return Err(bad(
                    "SET_BACKEND_REQ_FD with an fd that is not a socket".into()
                ));
            }
            let s = session.lock().map_err(|_| bad("session poisoned".into()))?;
            // SAFETY: the fd was just received and is owned by `file` alone.
            let stream = unsafe {
                <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(
                    std::os::fd::IntoRawFd::into_raw_fd(file),
                )
            };
            s.channel.set(stream)?;
            info!(port = s.port, "backend request channel set");
            s.protocol
        }
        SET_VRING_ENABLE => return take_early_vring_enable(sock, session),
        SET_LOG_FD => {
            // An eventfd for the backend to signal log updates with (the crate does not
            // dispatch the message). pvnet marks the shared bitmap directly and QEMU reads it
            // when it syncs, so the fd is taken and closed, and the message acked.
            drop(recv_one_fd(sock, "SET_LOG_FD", size)?);
            let s = session.lock().map_err(|_| bad("session poisoned".into()))?;
            info!(
                port = s.port,
                "SET_LOG_FD: the log is read by the frontend at its syncs"
            );
            s.protocol
        }
        SEND_RARP => {
            if size != 8 {
                return Err(bad(format!("SEND_RARP of {size} bytes")));
            }
            let mut m = [0u8; HDR_LEN + 8];
            (&*sock).read_exact(&mut m)?;
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&m[HDR_LEN..HDR_LEN + 6]);
            let s = session.lock().map_err(|_| bad("session poisoned".into()))?;
            info!(
                port = s.port,
                mac = format_args!(
                    "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                    mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
                ),
                "SEND_RARP: the guest is here now (migrated)"
            );
            s.hooks.announce(s.port, mac);
            s.protocol
        }
        _ => return Ok(false),
    };
    reply_ack(sock, request, flags, ok, 0)?;
    Ok(true)
}

/// IOTLB messages applied as one run before one publish.
const IOTLB_RUN: usize = 256;

/// `VHOST_USER_IOTLB_MSG`s, the first already peeked (`size`): this one and those queued
/// right behind it (up to [`IOTLB_RUN`]) are applied in order, the snapshot is published once
/// for all of them, and then they are acked, in one write. A frontend that pipelines its
/// grants (a burst's worth, then the acks) pays two reads and one publish per burst instead
/// of per message; one that waits for each ack sees no difference. Every ack follows the
/// publish, so an invalidation has taken effect when it is acked.
fn take_iotlb_run(
    sock: &UnixStream,
    session: &Mutex<Session>,
    size: usize,
) -> std::io::Result<bool> {
    use crate::iotlb::{BODY_LEN, IOTLB_MSG};
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    const MSG: usize = HDR_LEN + BODY_LEN;
    const ACK: usize = HDR_LEN + 8;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    if size != BODY_LEN {
        return Err(bad(format!("IOTLB message of {size} bytes")));
    }
    let mut buf = [0u8; IOTLB_RUN * MSG];
    // What is queued already (MSG_DONTWAIT: never wait for more), then the whole IOTLB
    // messages at its start, which the read below takes.
    // SAFETY: `buf` is valid for writes of its length; MSG_PEEK leaves the bytes queued.
    let peeked = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    let peeked = usize::try_from(peeked).unwrap_or(0);
    let mut whole = 0;
    while (whole + 1) * MSG <= peeked {
        let m = &buf[whole * MSG..];
        if le32(m, 0) != IOTLB_MSG {
            break;
        }
        if le32(m, 8) as usize != BODY_LEN {
            return Err(bad(format!("IOTLB message of {} bytes", le32(m, 8))));
        }
        whole += 1;
    }
    // The first message's body may still be on its way: then it alone, waiting for it.
    let whole = whole.max(1);
    (&*sock).read_exact(&mut buf[..whole * MSG])?;
    // Read before the lock: a frontend that sends half a message holds only its own session
    // thread, not whoever else needs the session.
    let mut s = session.lock().map_err(|_| bad("session poisoned".into()))?;
    let ack_wanted = s.protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0;
    let mut acks = [0u8; IOTLB_RUN * ACK];
    let mut n_acks = 0;
    let mut change: Option<bool> = None;
    for m in buf[..whole * MSG].chunks_exact(MSG) {
        let msg = IotlbMsg::parse(&m[HDR_LEN..])
            .ok_or_else(|| bad(format!("IOTLB message of type {}", m[HDR_LEN + 25])))?;
        if let Some(revoked) = s.iotlb_msg(msg).map_err(bad)? {
            change = Some(change.unwrap_or(false) | revoked);
        }
        if le32(m, 4) & HDR_NEED_REPLY != 0 && ack_wanted {
            acks[n_acks * ACK..][..ACK].copy_from_slice(&ack(IOTLB_MSG, 0));
            n_acks += 1;
        }
    }
    if let Some(wait) = change {
        s.publish(wait).map_err(|e| bad(e.to_string()))?;
    }
    drop(s);
    (&*sock).write_all(&acks[..n_acks * ACK])?;
    Ok(true)
}

/// Acks a request the session handled itself, if the frontend asked (`NEED_REPLY` with
/// `REPLY_ACK` negotiated): `status` 0 for success.
fn reply_ack(
    sock: &UnixStream,
    request: u32,
    flags: u32,
    protocol: u64,
    status: u64,
) -> std::io::Result<()> {
    use std::io::Write;
    if flags & HDR_NEED_REPLY != 0 && protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0 {
        (&*sock).write_all(&ack(request, status))?;
    }
    Ok(())
}

/// The reply to `request` carrying `status` (0: success) as its u64 body.
fn ack(request: u32, status: u64) -> [u8; HDR_LEN + 8] {
    let mut reply = [0u8; HDR_LEN + 8];
    reply[0..4].copy_from_slice(&request.to_le_bytes());
    reply[4..8].copy_from_slice(&(HDR_VERSION | HDR_REPLY).to_le_bytes());
    reply[8..12].copy_from_slice(&8u32.to_le_bytes());
    reply[12..20].copy_from_slice(&status.to_le_bytes());
    reply
}

/// The little-endian u32 at byte `i` of a message (the header's words).
fn le32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Sessions one listener runs at once (each is a thread): a switch port takes one frontend,
/// `pvnet backend` without `--sessions` at most this many; more are refused.
pub const MAX_SESSIONS: usize = 64;

/// A vhost-user server socket, listening. Bound apart from the accept loop so that a caller
/// (the switch adding a port at runtime) learns at once that the path cannot be bound.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: std::path::PathBuf,
    /// The inode bound: at exit only our own socket is unlinked, never one a newer backend
    /// has since bound at the same path.
    ours: Option<u64>,
}

impl Listener {
    /// Binds and listens at `path`, replacing a stale socket file there. Binds under a
    /// temporary name, then renames into place: the path only ever names a socket that is
    /// already listening (bind creates it before listen, and a frontend that connects in
    /// between, as QEMU and tests do the moment the path exists, is refused).
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        let tmp = path.with_file_name(format!(
            ".{}.{}.tmp",
            path.file_name()
                .map_or_else(|| "pvnet".into(), |n| n.to_string_lossy()),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp)?;
        std::fs::rename(&tmp, path)?;
        let ours = inode(path);
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            path: path.to_path_buf(),
            ours,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if inode(&self.path) == self.ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The inode `path` names now, if any.
fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path)
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
}

fn serve_impl(
    l: Listener,
    cfg: SharedConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
    max_sessions: Option<u32>,
    fixed: Option<PortId>,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (listener, path) = (&l.listener, l.path.as_path());
    info!(socket = %path.display(), "listening for vhost-user frontends");
    let log = Arc::new(PeerLog::default());
    let next = AtomicU32::new(0);
    let mut sessions: Vec<(std::thread::JoinHandle<()>, UnixStream)> = Vec::new();
    // With a bound on sessions, look every 20 ms whether they have all ended; else wake only
    // for a frontend connecting or the stop.
    let tick = max_sessions.map(|_| Duration::from_millis(20));
    while !stop.is_set() {
        sessions.retain(|(t, _)| !t.is_finished());
        if max_sessions.is_some_and(|m| next.load(Ordering::Relaxed) >= m) && sessions.is_empty() {
            break;
        }
        match listener.accept() {
            Ok((stream, _)) if max_sessions.is_some_and(|m| next.load(Ordering::Relaxed) >= m) => {
                peer_warn!(
                    log,
                    "refusing a frontend: this backend serves {} session(s)",
                    max_sessions.unwrap_or(0)
                );
                drop(stream);
            }
            Ok((stream, _))
                if fixed.is_some() && !sessions_below_within(&mut sessions, 1, GRACE, false) =>
            {
                peer_warn!(
                    log,
                    socket = %path.display(),
                    "refusing a frontend: this port already has one attached"
                );
                drop(stream);
            }
            Ok((stream, _))
                if sessions.len() >= MAX_SESSIONS
                    && !sessions_below_within(&mut sessions, MAX_SESSIONS, GRACE, true) =>
            {
                peer_warn!(
                    log,
                    socket = %path.display(),
                    "refusing a frontend: {MAX_SESSIONS} sessions already attached"
                );
                drop(stream);
            }
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                let n = next.fetch_add(1, Ordering::Relaxed);
                let port = fixed.unwrap_or(n);
                info!(port, "frontend connected");
                sessions.push(spawn_session(stream, port, &cfg, &hooks, &log)?);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                stop.wait(listener.as_raw_fd(), libc::POLLIN, tick);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    for (_, s) in &sessions {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for (t, _) in sessions {
        let _ = t.join();
    }
    Ok(())
}

/// Runs a session for `stream` on a thread of its own, with the port's offer as it is now;
/// returns the thread and a copy of the socket, to shut it down from outside (which ends a
/// session blocked reading a silent frontend).
fn spawn_session(
    stream: UnixStream,
    port: PortId,
    cfg: &SharedConfig,
    hooks: &Arc<dyn DeviceHooks>,
    log: &Arc<PeerLog>,
) -> std::io::Result<(std::thread::JoinHandle<()>, UnixStream)> {
    let handle = stream.try_clone()?;
    let cfg = *cfg.lock().unwrap_or_else(|e| e.into_inner());
    let (hooks, log) = (hooks.clone(), log.clone());
    let t = std::thread::Builder::new()
        .name(format!("vu-ctl-{port}"))
        .spawn(move || run_session(stream, port, cfg, hooks, log))?;
    Ok((t, handle))
}

/// Client mode: connects to a frontend's listening socket (QEMU `server=on`), retrying every
/// `retry` until it answers, and runs the session; then reconnects, until `stop` is set (which
/// also ends a session in progress: the frontend sees the backend disconnect). Every session
/// gets `fixed` if given (a switch port), else 0, 1, 2, ...
pub fn connect_loop(
    path: &Path,
    cfg: SharedConfig,
    hooks: Arc<dyn DeviceHooks>,
    stop: Arc<Stop>,
    retry: Duration,
    fixed: Option<PortId>,
) {
    use std::os::fd::AsRawFd;
    let mut n = 0;
    let log = Arc::new(PeerLog::default());
    while !stop.is_set() {
        match UnixStream::connect(path) {
            Ok(stream) => {
                let port = fixed.unwrap_or(n);
                info!(socket = %path.display(), port, "connected to frontend");
                let Ok((t, handle)) = spawn_session(stream, port, &cfg, &hooks, &log) else {
                    continue;
                };
                // Sleep until the frontend hangs up or the stop (then shut the socket down:
                // that ends a session blocked reading it); a session that ended by itself
                // (a violation) is seen within a second.
                while !t.is_finished() {
                    if stop.is_set() {
                        let _ = handle.shutdown(std::net::Shutdown::Both);
                        break;
                    }
                    stop.wait(
                        handle.as_raw_fd(),
                        libc::POLLRDHUP,
                        Some(Duration::from_secs(1)),
                    );
                    if !t.is_finished() && !stop.is_set() {
                        // Hung up (or a second passed): give the session a moment to end.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                let _ = t.join();
                n += 1;
            }
            Err(e) => {
                debug!(socket = %path.display(), "connect failed ({e}), retrying");
                stop.wait(-1, 0, Some(retry));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use virtq::Translate;

    /// A dataplane that runs nothing and records the addresses announced to it.
    #[derive(Default)]
    struct NoHooks(Mutex<Vec<(PortId, [u8; 6])>>);
    impl DeviceHooks for NoHooks {
        fn port_connected(&self, _: PortId) {}
        fn start_queue(&self, _: PortId, _: StartedQueue) {}
        fn stop_queue(&self, _: PortId, _: u16) -> Option<u16> {
            None
        }
        fn set_mem(&self, _: PortId, _: Arc<MemTable>, _: bool) {}
        fn port_gone(&self, _: PortId) {}
        fn announce(&self, port: PortId, mac: [u8; 6]) {
            self.0.lock().unwrap().push((port, mac));
        }
    }

    fn session() -> Mutex<Session> {
        Mutex::new(Session::new(
            0,
            BackendConfig::default(),
            Arc::new(NoHooks::default()),
            Arc::default(),
        ))
    }

    fn msg(request: u32, flags: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&request.to_le_bytes());
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        m.extend_from_slice(body);
        m
    }

    fn vring_state(index: u32, num: u32) -> Vec<u8> {
        [index.to_le_bytes(), num.to_le_bytes()].concat()
    }

    fn memfd(len: u64) -> File {
        // SAFETY: a valid NUL-terminated name; the fd is checked, then owned by the File.
        let fd = unsafe { libc::memfd_create(c"limits".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: `fd` was just created and nothing else owns it.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).expect("ftruncate");
        f
    }

    /// The per-session limits a frontend cannot push past: memory regions (the slots
    /// offered), queues (the pairs offered), queue sizes (a power of two up to the largest);
    /// each refused with its reason, and the session keeps what it had.
    #[test]
    fn a_frontend_cannot_push_past_the_session_limits() {
        let s = session();
        let mut s = s.lock().unwrap();
        let slots = s.cfg.mem_slots;
        let region = |i: u64| VhostUserSingleMemoryRegion::new(i << 20, 4096, i << 32, 0);
        for i in 0..slots {
            s.add_mem_region(&region(i), memfd(4096), None)
                .unwrap_or_else(|e| panic!("region {i} of {slots}: {e}"));
        }
        assert!(s.add_mem_region(&region(slots), memfd(4096), None).is_err());
        assert_eq!(s.regions.len() as u64, slots);
        assert_eq!(s.mem.as_ref().map(|m| m.len() as u64), Some(slots));
        // A region that is not there cannot be removed; one that is, can.
        let absent = VhostUserSingleMemoryRegion::new(1 << 40, 4096, 0, 0);
        assert!(s.remove_mem_region(&absent).is_err());
        s.remove_mem_region(&region(0)).expect("remove region 0");
        assert_eq!(s.regions.len() as u64, slots - 1);
        // The same region added again (QEMU: one vhost device per queue pair, each adds every
        // region) takes no slot and stays until each add is removed; an overlapping one that
        // is not the same is refused.
        s.add_mem_region(&region(1), memfd(4096), None)
            .expect("the same region again");
        assert_eq!(s.regions.len() as u64, slots - 1);
        let overlap = VhostUserSingleMemoryRegion::new(1 << 20, 8192, 1 << 32, 0);
        assert!(s.add_mem_region(&overlap, memfd(8192), None).is_err());
        s.remove_mem_region(&region(1)).expect("first remove");
        assert_eq!(s.regions.len() as u64, slots - 1, "still added once");
        s.remove_mem_region(&region(1)).expect("second remove");
        assert_eq!(s.regions.len() as u64, slots - 2);

        let queues = u32::from(s.cfg.queue_pairs) * 2;
        assert!(
            s.set_vring_num(queues, 256).is_err(),
            "queue past the pairs offered"
        );
        assert!(s.set_vring_num(u32::MAX, 256).is_err());
        let max = u32::from(s.cfg.max_queue_size);
        assert!(
            s.set_vring_num(0, max * 2).is_err(),
            "size past the largest"
        );
        assert!(s.set_vring_num(0, 384).is_err(), "size not a power of two");
        s.set_vring_num(0, max).expect("the largest size");
        assert!(s
            .set_vring_kick(u8::try_from(queues).unwrap(), None)
            .is_err());
    }

    fn iotlb(iova: u64, size: u64, uaddr: u64, perm: u8, kind: Kind) -> Vec<u8> {
        IotlbMsg {
            iova,
            size,
            uaddr,
            perm,
            kind,
        }
        .message(crate::iotlb::IOTLB_MSG, HDR_VERSION | HDR_NEED_REPLY)
        .to_vec()
    }

    /// A session with 1 MiB of shared memory at user address 1 << 32, the IOMMU negotiated
    /// unless `iommu` is false, and REPLY_ACK.
    fn iommu_session(iommu: bool) -> Mutex<Session> {
        let s = session();
        {
            let mut g = s.lock().unwrap();
            let acked = DEVICE_FEATURES & !if iommu { 0 } else { VIRTIO_F_ACCESS_PLATFORM };
            g.set_features(acked).unwrap();
            g.protocol = VhostUserProtocolFeatures::REPLY_ACK.bits();
            let r = VhostUserSingleMemoryRegion::new(0, 1 << 20, 1 << 32, 0);
            g.add_mem_region(&r, memfd(1 << 20), None).unwrap();
        }
        s
    }

    /// Sends one message and lets the session take it: Ok(ack status) or the error that
    /// ends the session.
    fn send(s: &Mutex<Session>, m: &[u8]) -> std::io::Result<u64> {
        let (mut front, back) = UnixStream::pair().unwrap();
        front.write_all(m).unwrap();
        assert!(take_own_message(&back, s)?, "taken by the session");
        let mut ack = [0u8; HDR_LEN + 8];
        front.read_exact(&mut ack).unwrap();
        Ok(u64::from_le_bytes(ack[HDR_LEN..].try_into().unwrap()))
    }

    /// Grants and revocations change what the snapshot translates, and only that: a revoked
    /// range is refused, a read-only grant refuses a write.
    #[test]
    fn iotlb_updates_and_invalidations_reach_the_snapshot() {
        let s = iommu_session(true);
        let base = 1u64 << 32;
        assert_eq!(
            send(&s, &iotlb(0x1000, 0x2000, base, 3, Kind::Update)).unwrap(),
            0
        );
        assert_eq!(
            send(&s, &iotlb(0x8000, 0x1000, base + 0x8000, 1, Kind::Update)).unwrap(),
            0
        );
        let mem = s.lock().unwrap().mem.clone().unwrap();
        assert!(mem.is_granted());
        let mut hint = 0;
        assert!(mem.translate(0x1800, Perm::Write, &mut hint).is_ok());
        assert!(mem.translate(0x8000, Perm::Read, &mut hint).is_ok());
        let denied = mem.translate(0x8000, Perm::Write, &mut hint).unwrap_err();
        assert!(matches!(
            mem.miss_error(denied),
            virtq::Error::AccessDenied { .. }
        ));
        assert!(
            mem.translate(0x4000, Perm::Read, &mut hint).is_err(),
            "never granted"
        );
        // Revoke the middle page of the first grant.
        assert_eq!(
            send(&s, &iotlb(0x2000, 0x1000, 0, 0, Kind::Invalidate)).unwrap(),
            0
        );
        let mem = s.lock().unwrap().mem.clone().unwrap();
        assert!(mem.translate(0x1fff, Perm::Write, &mut hint).is_ok());
        let miss = mem.translate(0x2000, Perm::Read, &mut hint).unwrap_err();
        assert!(
            mem.miss_error(miss).is_retryable(),
            "revoked: a miss, retryable"
        );
        // An invalidation of nothing is acked and changes nothing.
        assert_eq!(
            send(&s, &iotlb(0x10_0000, 0x1000, 0, 0, Kind::Invalidate)).unwrap(),
            0
        );
        assert_eq!(s.lock().unwrap().iotlb.len(), 2);
    }

    /// A pipelined run of IOTLB messages is taken in one go, in order, up to the first
    /// other message: one snapshot for all of it, then one ack per message that asked.
    #[test]
    fn a_pipelined_iotlb_run_is_applied_in_order_and_acked() {
        let s = iommu_session(true);
        let base = 1u64 << 32;
        let (mut front, back) = UnixStream::pair().unwrap();
        let mut quiet = iotlb(0x8000, 0x1000, base + 0x8000, 1, Kind::Update);
        quiet[4..8].copy_from_slice(&HDR_VERSION.to_le_bytes()); // no NEED_REPLY
        let get_features = msg(1, HDR_VERSION, &[]);
        let run = [
            iotlb(0x1000, 0x3000, base, 3, Kind::Update),
            iotlb(0x2000, 0x1000, 0, 0, Kind::Invalidate),
            quiet,
            iotlb(0x2000, 0x800, base + 0x1_0000, 2, Kind::Update),
            iotlb(0x9000, 0x1000, base, 3, Kind::Invalidate), // nothing there: acked
            get_features.clone(),
            iotlb(0x4000, 0x1000, base, 3, Kind::Update),
        ]
        .concat();
        front.write_all(&run).unwrap();
        assert!(take_own_message(&back, &s).unwrap());
        // Four acks, all success, and nothing more.
        let mut acks = [0u8; 4 * (HDR_LEN + 8)];
        front.read_exact(&mut acks).unwrap();
        for a in acks.chunks_exact(HDR_LEN + 8) {
            assert_eq!(a[0..4], crate::iotlb::IOTLB_MSG.to_le_bytes());
            assert_eq!(a[HDR_LEN..], [0u8; 8]);
        }
        front.set_nonblocking(true).unwrap();
        assert!(front.read(&mut [0u8; 1]).is_err(), "no fifth ack");
        // The run stopped at GET_FEATURES, which is left for the crate.
        let mut b = vec![0u8; get_features.len()];
        (&back).read_exact(&mut b).unwrap();
        assert_eq!(b, get_features);
        // What the snapshot translates is the run applied in order.
        let mem = s.lock().unwrap().mem.clone().unwrap();
        let mut hint = 0;
        let at = |iova, perm, hint: &mut usize| {
            mem.translate(iova, perm, hint)
                .ok()
                .map(|(p, _)| p.as_ptr() as u64)
        };
        let head = at(0x1000, Perm::Write, &mut hint).unwrap();
        assert_eq!(at(0x1fff, Perm::Write, &mut hint), Some(head + 0xfff));
        let new = at(0x2000, Perm::Write, &mut hint).unwrap();
        assert_eq!(new, head + 0x1_0000, "the newer grant, at its own address");
        assert_eq!(at(0x2000, Perm::Read, &mut hint), None, "write-only");
        assert_eq!(
            at(0x2800, Perm::Write, &mut hint),
            None,
            "revoked, not granted again"
        );
        assert_eq!(at(0x3000, Perm::Write, &mut hint), Some(head + 0x2000));
        assert!(
            at(0x8000, Perm::Read, &mut hint).is_some(),
            "taken without an ack"
        );
        assert_eq!(
            at(0x4000, Perm::Read, &mut hint),
            None,
            "after the other message"
        );
        // A bad message inside a run ends the session.
        let s = iommu_session(true);
        let mut bad = iotlb(0x4000, 0x1000, base, 3, Kind::Update);
        bad[HDR_LEN + 25] = 9;
        let run = [iotlb(0x1000, 0x1000, base, 3, Kind::Update), bad].concat();
        let (mut front, back) = UnixStream::pair().unwrap();
        front.write_all(&run).unwrap();
        assert!(take_own_message(&back, &s).is_err());
    }

    /// Hostile IOTLB messages end the session (and with it only that port) with a reason.
    #[test]
    fn hostile_iotlb_messages_end_the_session() {
        let base = 1u64 << 32;
        let cases: &[(&str, Vec<u8>, bool)] = &[
            ("no feature", iotlb(0, 0x1000, base, 3, Kind::Update), false),
            (
                "no access bits",
                iotlb(0, 0x1000, base, 0, Kind::Update),
                true,
            ),
            (
                "unknown access bits",
                iotlb(0, 0x1000, base, 7, Kind::Update),
                true,
            ),
            (
                "IOVA range wraps",
                iotlb(u64::MAX - 10, 0x1000, base, 3, Kind::Update),
                true,
            ),
            ("empty", iotlb(0, 0, base, 3, Kind::Update), true),
            (
                "outside shared memory",
                iotlb(0, 0x1000, base + (1 << 20), 3, Kind::Update),
                true,
            ),
            (
                "straddles its end",
                iotlb(0, 0x2000, base + (1 << 20) - 0x1000, 3, Kind::Update),
                true,
            ),
            (
                "user range wraps",
                iotlb(0, 0x2000, u64::MAX - 0x1000, 3, Kind::Update),
                true,
            ),
            (
                "a backend's message",
                iotlb(0, 0x1000, base, 3, Kind::Miss),
                true,
            ),
            (
                "access fail",
                iotlb(0, 0x1000, base, 3, Kind::AccessFail),
                true,
            ),
            (
                "unknown type",
                {
                    let mut m = iotlb(0, 0x1000, base, 3, Kind::Update);
                    m[HDR_LEN + 25] = 9;
                    m
                },
                true,
            ),
            (
                "short body",
                msg(crate::iotlb::IOTLB_MSG, HDR_VERSION, &[0u8; 16]),
                true,
            ),
        ];
        for (why, m, iommu) in cases {
            let s = iommu_session(*iommu);
            let e = send(&s, m).expect_err(why);
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{why}: {e}");
            assert!(s.lock().unwrap().iotlb.is_empty(), "{why}: nothing granted");
        }
        // A SET_BACKEND_REQ_FD without its fd.
        let s = iommu_session(true);
        let m = msg(crate::iotlb::SET_BACKEND_REQ_FD, HDR_VERSION, &[]);
        assert!(send(&s, &m).is_err());
        assert!(!s.lock().unwrap().channel.is_set());
    }

    /// A backend channel that is not a socket, or comes with more than one fd, is refused,
    /// and every fd sent with it is closed.
    #[test]
    fn a_bad_backend_channel_is_refused_and_its_fds_closed() {
        use vmm_sys_util::sock_ctrl_msg::ScmSocket;
        // Other tests open and close fds at the same time: count only this test's memfds.
        let ours = || {
            std::fs::read_dir("/proc/self/fd")
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().contains("memfd:bad-channel"))
                })
                .count()
        };
        let m = msg(crate::iotlb::SET_BACKEND_REQ_FD, HDR_VERSION, &[]);
        for n in [1usize, 2, 3] {
            let s = iommu_session(true);
            let (front, back) = UnixStream::pair().unwrap();
            let files: Vec<File> = (0..n)
                .map(|_| {
                    // SAFETY: a valid name; the fd is checked, then owned by the File.
                    let fd = unsafe { libc::memfd_create(c"bad-channel".as_ptr(), 0) };
                    assert!(fd >= 0);
                    // SAFETY: just created, owned by nothing else.
                    unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) }
                })
                .collect();
            let raw: Vec<i32> = files.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
            front.send_with_fds(&[&m[..]], &raw).unwrap();
            assert!(take_own_message(&back, &s).is_err(), "{n} fds");
            assert!(!s.lock().unwrap().channel.is_set());
            drop(files);
            assert_eq!(ours(), 0, "{n} fds: every received fd closed");
        }
    }

    /// A flood of grants stops at the bound: the session ends, having held at most the bound.
    #[test]
    fn a_flood_of_grants_is_bounded() {
        let s = iommu_session(true);
        let base = 1u64 << 32;
        let mut n = 0u64;
        let err = loop {
            match send(
                &s,
                &iotlb(
                    n * 0x2000,
                    0x1000,
                    base + (n % 256) * 0x1000,
                    3,
                    Kind::Update,
                ),
            ) {
                Ok(0) => n += 1,
                Ok(st) => panic!("nacked with {st}"),
                Err(e) => break e,
            }
            assert!(n <= MAX_GRANTS as u64, "past the bound");
        };
        assert!(err.to_string().contains("grants"), "{err}");
        assert!(s.lock().unwrap().iotlb.len() <= MAX_GRANTS);
        assert!(n >= MAX_GRANTS as u64 - 2, "{n}");
    }

    /// The migration messages the crate does not dispatch: SEND_RARP reaches the dataplane
    /// (the switch relearns the address), SET_LOG_FD is taken with its fd; both acked; a
    /// SEND_RARP of the wrong size ends the session.
    #[test]
    fn migration_messages_are_taken_and_acked() {
        use vmm_sys_util::sock_ctrl_msg::ScmSocket;
        let seen = Arc::new(NoHooks::default());
        let s = Mutex::new(Session::new(
            7,
            BackendConfig::default(),
            seen.clone(),
            Arc::new(PeerLog::default()),
        ));
        s.lock().unwrap().protocol = VhostUserProtocolFeatures::REPLY_ACK.bits();
        let (mut front, back) = UnixStream::pair().unwrap();
        let need_reply = HDR_VERSION | HDR_NEED_REPLY;
        let ack = |front: &mut UnixStream, req: u32| {
            let mut reply = [0u8; 20];
            front.read_exact(&mut reply).unwrap();
            assert_eq!(reply[..4], req.to_le_bytes());
            assert_eq!(reply[12..], [0u8; 8], "success");
        };
        front
            .write_all(&msg(SEND_RARP, need_reply, &[2, 0, 0, 0, 0, 9, 0, 0]))
            .unwrap();
        assert!(take_own_message(&back, &s).unwrap());
        ack(&mut front, SEND_RARP);
        assert_eq!(*seen.0.lock().unwrap(), [(7, [2, 0, 0, 0, 0, 9])]);
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        front
            .send_with_fds(
                &[&msg(SET_LOG_FD, need_reply, &[])[..]],
                &[std::os::fd::AsRawFd::as_raw_fd(&efd)],
            )
            .unwrap();
        assert!(take_own_message(&back, &s).unwrap());
        ack(&mut front, SET_LOG_FD);
        front
            .write_all(&msg(SEND_RARP, need_reply, &[2, 0, 0, 0]))
            .unwrap();
        assert!(take_own_message(&back, &s).is_err());
    }

    /// QEMU 7.2 vhost-user-net: SET_VRING_ENABLE before SET_FEATURES is honoured and acked.
    #[test]
    fn early_vring_enable_is_recorded_and_acked() {
        let (mut front, back) = UnixStream::pair().unwrap();
        let s = session();
        s.lock().unwrap().protocol = VhostUserProtocolFeatures::REPLY_ACK.bits();
        let need_reply = HDR_VERSION | HDR_NEED_REPLY;
        front
            .write_all(&msg(SET_VRING_ENABLE, need_reply, &vring_state(1, 1)))
            .unwrap();
        assert!(take_early_vring_enable(&back, &s).unwrap());
        assert!(s.lock().unwrap().vrings[1].enabled);
        let mut reply = [0u8; 20];
        front.read_exact(&mut reply).unwrap();
        assert_eq!(
            reply[..12],
            msg(SET_VRING_ENABLE, HDR_VERSION | HDR_REPLY, &[0; 8])[..12]
        );
        assert_eq!(reply[12..], [0u8; 8]);
    }

    /// Anything else (and everything once protocol features are acked) is left to the crate.
    #[test]
    fn other_messages_are_not_consumed() {
        let (mut front, back) = UnixStream::pair().unwrap();
        let s = session();
        let get_features = msg(1, HDR_VERSION, &[]);
        front.write_all(&get_features).unwrap();
        assert!(!take_early_vring_enable(&back, &s).unwrap());
        let mut b = vec![0u8; get_features.len()];
        (&back).read_exact(&mut b).unwrap();
        assert_eq!(b, get_features);

        s.lock().unwrap().acked = VHOST_USER_F_PROTOCOL_FEATURES;
        let enable = msg(SET_VRING_ENABLE, HDR_VERSION, &vring_state(0, 1));
        front.write_all(&enable).unwrap();
        assert!(!take_early_vring_enable(&back, &s).unwrap());
        let mut b = vec![0u8; enable.len()];
        (&back).read_exact(&mut b).unwrap();
        assert_eq!(b, enable);
        assert!(!s.lock().unwrap().vrings[0].enabled);
    }

    /// DPDK virtio-user sizes queues the application did not set up as 0: accepted, and the
    /// ring is left stopped even once it has memory, addresses and a kick.
    #[test]
    fn zero_size_ring_is_accepted_and_never_started() {
        // SAFETY: a plain memfd_create call with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"pvnet-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh descriptor we own.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(1 << 20).unwrap();
        let s = session();
        let mut s = s.lock().unwrap();
        let region = VhostUserMemoryRegion::new(0, 1 << 20, 0x1000_0000, 0);
        s.set_mem_table(&[region], vec![file], None).unwrap();
        s.set_vring_num(1, 0).unwrap();
        assert!(s.set_vring_num(1, 3).is_err());
        assert!(s.set_vring_num(1, 65536).is_err());
        s.set_vring_addr(
            1,
            VhostUserVringAddrFlags::empty(),
            0x1000_0000,
            0x1000_2000,
            0x1000_1000,
            0,
        )
        .unwrap();
        s.set_vring_kick(1, None).unwrap();
        assert!(!s.vrings[1].running);
    }
}
