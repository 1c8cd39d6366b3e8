//! How [`NetClient::connect`](super::NetClient::connect) sets a connection up, step by step:
//! the features negotiated, the memfd shared, the queues built, the fixed grants made, the
//! rings handed to the backend; and the watchdog over the replies it waits for.

use super::{os, ClientConfig, Error, Layout, ToUser, GPA_BASE};
use crate::features::{
    RX_QUEUE, TX_QUEUE, VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM,
    VIRTIO_F_EVENT_IDX, VIRTIO_F_IN_ORDER, VIRTIO_F_RING_PACKED, VIRTIO_F_VERSION_1,
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_MRG_RXBUF,
};
use crate::iotlb::{GrantMode, Granter};
use crate::rxpool::RxPool;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtq::split::ring_sizes;
use virtq::{AddrSpace, Direction, DriverQueue, Format, MemTable, Perm, QueueConfig, RegionSpec};
use vmm_sys_util::eventfd::EventFd;

/// Negotiates the device and protocol features `cfg` asks for with what the backend offers;
/// returns the device features set.
pub(super) fn negotiate(fe: &mut Frontend, cfg: &ClientConfig) -> Result<u64, Error> {
    let offered = fe.get_features()?;
    if offered & VIRTIO_F_VERSION_1 == 0 && !cfg.legacy_hdr {
        return Err(Error::Missing("VIRTIO_F_VERSION_1"));
    }
    let mut want = VHOST_USER_F_PROTOCOL_FEATURES;
    if !cfg.legacy_hdr {
        want |= VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF;
    }
    if cfg.guest_tso {
        want |= VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4 | VIRTIO_NET_F_GUEST_TSO6;
    }
    if cfg.packed {
        // IN_ORDER with the packed ring: the device may return a transmit batch with one
        // used descriptor (one cache line read per batch instead of one per buffer).
        want |= VIRTIO_F_RING_PACKED | VIRTIO_F_IN_ORDER;
    }
    if cfg.event_idx {
        want |= VIRTIO_F_EVENT_IDX;
    }
    if cfg.grants != GrantMode::Off {
        if offered & VIRTIO_F_ACCESS_PLATFORM == 0 {
            return Err(Error::Missing("VIRTIO_F_ACCESS_PLATFORM (grants)"));
        }
        want |= VIRTIO_F_ACCESS_PLATFORM;
    }
    let mut features = offered & want;
    if features & VIRTIO_F_RING_PACKED == 0 {
        // The split driver takes every used buffer on its own entry: no IN_ORDER there.
        features &= !VIRTIO_F_IN_ORDER;
    }
    // With an IOMMU: misses come on the backend channel, and every grant is acked.
    let iotlb_proto = VhostUserProtocolFeatures::BACKEND_REQ | VhostUserProtocolFeatures::REPLY_ACK;
    let iommu = cfg.grants != GrantMode::Off;
    if features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
        let p = fe.get_protocol_features()?;
        let mut ask = VhostUserProtocolFeatures::MQ;
        if iommu {
            if !p.contains(iotlb_proto) {
                return Err(Error::Missing("BACKEND_REQ and REPLY_ACK (grants)"));
            }
            ask |= iotlb_proto;
        }
        fe.set_protocol_features(p & ask)?;
    } else if iommu {
        return Err(Error::Missing("protocol features (grants)"));
    }
    fe.set_features(features)?;
    Ok(features)
}

/// The receive pool for the negotiated `features` (and header length `hdr`).
pub(super) fn rx_pool(cfg: &ClientConfig, features: u64, hdr: u32) -> RxPool {
    let big = VIRTIO_NET_F_GUEST_TSO4 | VIRTIO_NET_F_GUEST_TSO6;
    // The largest frame the device may send: 64 KiB with TSO, else an MTU of 1500, behind
    // an Ethernet header and a VLAN tag.
    let max_frame = 14 + 4 + if features & big != 0 { 65535 } else { 1500 };
    RxPool::new(
        cfg.rx_buffers,
        features & VIRTIO_NET_F_MRG_RXBUF != 0,
        cfg.rx_headroom.min(1024),
        hdr,
        cfg.queue_size,
        max_frame,
    )
}

/// Shares one memfd of `lay.len` bytes with the backend (its table: at [`GPA_BASE`]) and
/// builds our own table over it, from `base` (the address the rings use for its first byte);
/// returns the table and our user address of the memfd.
pub(super) fn share_memory(
    fe: &mut Frontend,
    lay: &Layout,
    base: u64,
) -> Result<(Arc<MemTable>, u64), Error> {
    let shm = SharedMem::new(lay.len)?;
    let uaddr = shm.base.as_ptr() as u64;
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: GPA_BASE,
        memory_size: lay.len,
        userspace_addr: uaddr,
        mmap_offset: 0,
        mmap_handle: shm.file.as_raw_fd(),
    };
    fe.set_mem_table(&[region])?;
    let spec = RegionSpec {
        gpa: base,
        len: lay.len,
        uaddr,
        host: shm.base,
    };
    // SAFETY: the spec is exactly the mapping owned by `shm`, which moves into the table.
    let mem = Arc::new(unsafe { MemTable::new(&[spec], Box::new(shm)) }?);
    Ok((mem, uaddr))
}

/// The ring format of the negotiated `features`, and the receive and transmit queues' driver
/// sides in it.
pub(super) fn queues(
    mem: &Arc<MemTable>,
    cfg: &ClientConfig,
    lay: &Layout,
    features: u64,
) -> Result<(Format, DriverQueue, DriverQueue), Error> {
    let event_idx = features & VIRTIO_F_EVENT_IDX != 0;
    let format = if features & VIRTIO_F_RING_PACKED != 0 {
        Format::Packed
    } else {
        Format::Split
    };
    let qcfg = |addrs, direction| QueueConfig {
        format,
        size: cfg.queue_size,
        addrs,
        space: AddrSpace::Guest,
        base: 0,
        event_idx,
        indirect: false,
        // Asked for with the packed ring only (see `negotiate`).
        in_order: features & VIRTIO_F_IN_ORDER != 0,
        direction,
    };
    let rx = DriverQueue::new(mem.clone(), &qcfg(lay.rx, Direction::DeviceWrites))?;
    let tx = DriverQueue::new(mem.clone(), &qcfg(lay.tx, Direction::DeviceReads))?;
    Ok((format, rx, tx))
}

/// The IOTLB grants made once, at connection: the rings for good (a driver's coherent
/// allocation), and with [`GrantMode::Pool`] both buffer pools (staging grants; per packet,
/// each buffer is granted while it is posted).
pub(super) fn grant_fixed(
    g: &mut Granter,
    cfg: &ClientConfig,
    lay: &Layout,
    rx_bytes: u64,
    to_user: ToUser,
) -> Result<(), Error> {
    let mut grant = |at: u64, len: u64, perm| {
        g.grant(at, len, to_user.at(at), perm)
            .map_err(os("IOTLB update"))
    };
    // Each ring's parts, which lie together.
    for a in [lay.rx, lay.tx] {
        let (_, _, ul) = ring_sizes(cfg.queue_size);
        grant(a.desc, a.used + ul - a.desc, Perm::ReadWrite)?;
    }
    // Receive buffers are granted read-write, as a Linux guest's VT-d mappings are
    // (intel-iommu sets read permission on every mapping when the IOMMU lacks
    // zero-length-read support, as QEMU's does), and as DPDK's vhost asks when it
    // fills one; pvnet's own device asks only for write.
    if cfg.grants == GrantMode::Pool {
        let tx_len = u64::from(cfg.queue_size) * u64::from(cfg.buf_size);
        grant(lay.rx_bufs, rx_bytes, Perm::ReadWrite)?;
        grant(lay.tx_bufs, tx_len, Perm::Read)?;
    }
    Ok(())
}

/// Tells the backend each ring's size, first index and addresses (`to_u` of ours), and
/// hands it the ring's [kick, call] eventfds.
pub(super) fn set_vrings(
    fe: &mut Frontend,
    cfg: &ClientConfig,
    lay: &Layout,
    format: Format,
    to_u: impl Fn(u64) -> u64,
    [kick, call]: [&[EventFd; 2]; 2],
) -> Result<(), Error> {
    for (q, addrs) in [(RX_QUEUE, lay.rx), (TX_QUEUE, lay.tx)] {
        fe.set_vring_num(q, cfg.queue_size)?;
        fe.set_vring_base(q, format.fresh_base())?;
        fe.set_vring_addr(
            q,
            &VringConfigData {
                queue_max_size: cfg.queue_size,
                queue_size: cfg.queue_size,
                flags: 0,
                desc_table_addr: to_u(addrs.desc),
                used_ring_addr: to_u(addrs.used),
                avail_ring_addr: to_u(addrs.avail),
                log_addr: None,
            },
        )?;
        fe.set_vring_call(q, &call[q])?;
        fe.set_vring_kick(q, &kick[q])?;
    }
    Ok(())
}

/// The memfd and its mapping.
#[derive(Debug)]
struct SharedMem {
    file: File,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory; access is governed by the MemTable built over it.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    fn new(len: u64) -> Result<Self, Error> {
        let name = c"pvnet-frontend";
        // SAFETY: valid C string; the fd is checked and then owned by the File.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Os {
                what: "memfd_create",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is fresh and owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len).map_err(os("ftruncate memfd"))?;
        let len = usize::try_from(len).map_err(|_| Error::Config("memory too large"))?;
        // SAFETY: new shared mapping of our own memfd; result checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Os {
                what: "mmap memfd",
                source: io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or(Error::Config("mmap returned null"))?;
        Ok(Self { file, base, len })
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referenced once the table drops.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Shuts the vhost-user socket down unless dropped within `after`: a backend that stops
/// answering turns a request that would wait forever into an error. (The `vhost` crate
/// retries a receive that times out, so `SO_RCVTIMEO` cannot do this.)
pub(super) struct Watchdog {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(super) fn arm(sock: &UnixStream, after: Duration) -> Result<Self, Error> {
        let sock = sock.try_clone().map_err(os("socket"))?;
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vu-watchdog".into())
            .spawn(move || {
                if wait.recv_timeout(after) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
            })
            .map_err(os("watchdog thread"))?;
        Ok(Self {
            done: Some(done),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Disconnecting the channel ends the wait at once.
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
