//! The state of one frontend connection: features, the memory table and the IOTLB over it,
//! the vrings' configuration; when a ring has all it needs it is started (handed to the
//! dataplane), and it is stopped (taken back) before its configuration changes.

use super::{BackendConfig, DeviceHooks, PortId, StartedQueue, MAX_GRANTS};
use crate::eventfd::Notifier;
use crate::features::{
    VHOST_F_LOG_ALL, VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM, VIRTIO_F_EVENT_IDX,
    VIRTIO_F_INDIRECT_DESC, VIRTIO_F_IN_ORDER, VIRTIO_F_RING_PACKED, VIRTIO_NET_F_MRG_RXBUF,
};
use crate::iotlb::{BackendChannel, IotlbMsg, Kind};
use crate::mmap::{map_regions, PeerRegion};
use crate::peer_warn;
use crate::ratelimit::PeerLog;
use pvnet_net::QueueIndex;
use std::fs::File;
use std::sync::Arc;
use tracing::{debug, info};
use vhost::vhost_user::message::VhostUserSingleMemoryRegion;
use vhost::vhost_user::{Error as VuError, Result as VuResult};
use virtq::AddrSpace;
use virtq::{DeviceQueue, Direction, Format, QueueConfig, RingAddrs};
use virtq::{DirtyLog, Grant, Iotlb, MemTable, Perm};

#[derive(Debug, Default)]
pub(super) struct Vring {
    pub(super) num: u16,
    pub(super) addrs: Option<RingAddrs>,
    pub(super) base: u16,
    pub(super) kick: Option<Option<File>>,
    pub(super) call: Option<File>,
    pub(super) err: Option<File>,
    pub(super) enabled: bool,
    pub(super) running: bool,
}

#[derive(Debug)]
pub(super) struct Region {
    pub(super) gpa: u64,
    pub(super) len: u64,
    pub(super) uaddr: u64,
    pub(super) mmap_offset: u64,
    pub(super) file: File,
    /// `ADD_MEM_REG`s of this very region not yet removed. QEMU (7.2) runs one vhost device
    /// per queue pair over the same connection and each adds (and removes) every region:
    /// the second add of a region is the same memory, not an overlap.
    pub(super) adds: u32,
}

impl Region {
    pub(super) fn same(&self, r: &VhostUserSingleMemoryRegion) -> bool {
        (self.gpa, self.len, self.uaddr, self.mmap_offset)
            == (r.guest_phys_addr, r.memory_size, r.user_addr, r.mmap_offset)
    }
}

/// The vhost-user state of one frontend connection.
pub struct Session {
    pub(super) port: PortId,
    pub(super) cfg: BackendConfig,
    pub(super) hooks: Arc<dyn DeviceHooks>,
    pub(super) acked: u64,
    pub(super) protocol: u64,
    pub(super) vrings: Vec<Vring>,
    pub(super) regions: Vec<Region>,
    /// The shared-memory table.
    pub(super) base: Option<Arc<MemTable>>,
    /// What the queues translate through: `base`, or under `VIRTIO_F_ACCESS_PLATFORM` the
    /// snapshot of `iotlb` over it.
    pub(super) mem: Option<Arc<MemTable>>,
    /// What the frontend granted (`VIRTIO_F_ACCESS_PLATFORM`).
    pub(super) iotlb: Iotlb,
    /// The backend request channel (`SET_BACKEND_REQ_FD`).
    pub(super) channel: Arc<BackendChannel>,
    /// The listener's bound on the warnings its frontends can cause.
    pub(super) log: Arc<PeerLog>,
    /// The dirty log (`SET_LOG_BASE`); used while `VHOST_F_LOG_ALL` is acked.
    pub(super) dirty: Option<Arc<DirtyLog>>,
    /// The MTU the frontend set (`NET_SET_MTU`).
    pub(super) mtu: Option<u16>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("port", &self.port)
            .field("acked", &self.acked)
            .finish()
    }
}

/// The smallest MTU a virtio-net device may report (virtio 1.x 5.1.4.1: 68, IPv4's minimum).
pub const MIN_MTU: u16 = 68;

/// Why a session refused a frontend's request. The cause is logged (with the port) where the
/// request is answered; the frontend sees the vhost-user error code.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// An MTU outside 68 up to the port's own (or 65535).
    #[error("MTU {mtu} outside {MIN_MTU}..={limit} (the port's MTU)")]
    Mtu {
        /// What the frontend asked for.
        mtu: u64,
        /// The port's configured MTU, or 65535.
        limit: u16,
    },
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
pub(super) fn refuse(log: &PeerLog, port: PortId, e: SessionError) -> VuError {
    peer_warn!(log, port, "request refused: {e}");
    VuError::InvalidParam
}

impl Session {
    /// [`refuse`] for this session's port.
    pub(super) fn refuse(&self, e: SessionError) -> VuError {
        refuse(&self.log, self.port, e)
    }

    /// `value` as a u16, or the request is refused.
    pub(super) fn fits_u16(&self, what: &'static str, value: u32) -> VuResult<u16> {
        u16::try_from(value).map_err(|_| self.refuse(SessionError::OutOfRange { what, value }))
    }
}

pub(super) fn io_err(e: std::io::Error) -> VuError {
    VuError::ReqHandlerError(e)
}

impl Session {
    /// A fresh session for `port`; the warnings its frontend causes count against `log`.
    pub(crate) fn new(
        port: PortId,
        cfg: BackendConfig,
        hooks: Arc<dyn DeviceHooks>,
        log: Arc<PeerLog>,
    ) -> Self {
        let n = QueueIndex::count(cfg.queue_pairs);
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
            mtu: None,
            log,
        }
    }

    /// `NET_SET_MTU`: the MTU the frontend gave its driver (QEMU's `host_mtu`), within the
    /// virtio-net range (68-65535, 5.1.4.1) and no larger than the port's configured one.
    /// Refused otherwise: QEMU then reports that the backend does not support the MTU and
    /// does not start the device, rather than run a guest whose frames pvnet drops.
    pub(super) fn set_mtu(&mut self, mtu: u64) -> Result<(), SessionError> {
        let limit = self.cfg.mtu.unwrap_or(u16::MAX);
        let ok = u16::try_from(mtu)
            .ok()
            .filter(|m| (MIN_MTU..=limit).contains(m));
        let Some(m) = ok else {
            let e = SessionError::Mtu { mtu, limit };
            peer_warn!(self.log, self.port, "NET_SET_MTU refused: {e}");
            return Err(e);
        };
        info!(port = self.port, mtu = m, "NET_SET_MTU: the frontend's MTU");
        self.mtu = Some(m);
        Ok(())
    }

    pub(super) fn iommu(&self) -> bool {
        self.acked & VIRTIO_F_ACCESS_PLATFORM != 0
    }

    /// Hands the queues what they translate through now: the shared-memory table, or under
    /// an IOMMU the snapshot of the grants over it. Returns only after every running queue
    /// switched (see [`DeviceHooks::set_mem`]), then starts the rings that were waiting for
    /// memory (or for a grant of their own addresses).
    pub(super) fn publish(&mut self, wait: bool) -> VuResult<()> {
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
    /// (`run::take_iotlb_run`). Returns `None` if nothing changed, else whether anything may
    /// have been revoked (the publish must then wait for the queues).
    pub(super) fn iotlb_msg(&mut self, m: IotlbMsg) -> Result<Option<bool>, String> {
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

    pub(super) fn vring(&mut self, index: u32) -> VuResult<&mut Vring> {
        let count = self.vrings.len();
        if index as usize >= count {
            return Err(self.refuse(SessionError::NoSuchQueue { index, count }));
        }
        Ok(&mut self.vrings[index as usize])
    }

    pub(super) fn remap(&mut self) -> VuResult<()> {
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

    pub(super) fn map_regions(&mut self) -> VuResult<()> {
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
    pub(super) fn maybe_start(&mut self, index: u16) -> VuResult<()> {
        let port = self.port;
        let log = self.log.clone();
        let Some((mem, cfg)) = self.ready(index)? else {
            return Ok(());
        };
        let queue = match DeviceQueue::new(mem, &cfg) {
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
        self.start(index, queue, &cfg)
    }

    /// The ring's configuration and the memory it runs over if it has everything it needs to
    /// start and is not running; `None` if it waits for something.
    fn ready(&mut self, index: u16) -> VuResult<Option<(Arc<MemTable>, QueueConfig)>> {
        let proto = self.acked & VHOST_USER_F_PROTOCOL_FEATURES != 0;
        let format = if self.acked & VIRTIO_F_RING_PACKED != 0 {
            Format::Packed
        } else {
            Format::Split
        };
        let acked = self.acked;
        let port = self.port;
        let Some(mem) = self.mem.clone() else {
            debug!(
                port,
                queue = index,
                "no memory table yet: the ring starts when it arrives"
            );
            return Ok(None);
        };
        let v = self.vring(u32::from(index))?;
        if v.running || v.kick.is_none() || (proto && !v.enabled) {
            return Ok(None);
        }
        let Some(addrs) = v.addrs else {
            return Ok(None);
        };
        if v.num == 0 {
            debug!(port, queue = index, "size 0: ring left stopped");
            return Ok(None);
        }
        let cfg = QueueConfig {
            format,
            size: v.num,
            addrs,
            space: AddrSpace::User,
            base: v.base,
            event_idx: acked & VIRTIO_F_EVENT_IDX != 0,
            indirect: acked & VIRTIO_F_INDIRECT_DESC != 0,
            in_order: acked & VIRTIO_F_IN_ORDER != 0,
            direction: if index.is_multiple_of(2) {
                Direction::DeviceWrites
            } else {
                Direction::DeviceReads
            },
        };
        Ok(Some((mem, cfg)))
    }

    /// Hands the validated ring to the dataplane with copies of its fds.
    fn start(&mut self, index: u16, mut queue: DeviceQueue, cfg: &QueueConfig) -> VuResult<()> {
        let port = self.port;
        if let Some((base, used)) = queue.resume_from_used() {
            peer_warn!(
                self.log,
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
            event_idx = cfg.event_idx,
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
                mergeable: self.acked & VIRTIO_NET_F_MRG_RXBUF != 0,
                features: self.acked,
                iotlb: iommu.then_some(channel),
                mtu: self.mtu.or(self.cfg.mtu),
            },
        );
        Ok(())
    }

    pub(super) fn stop(&mut self, index: u16) -> VuResult<u16> {
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

    pub(super) fn stop_all(&mut self) {
        for i in 0..self.vrings.len() {
            let _ = self.stop(u16::try_from(i).unwrap_or(u16::MAX));
        }
    }
}
