//! Hostile frontends against a real `pvnet backend` process.
//!
//! The frontend is untrusted: a malformed ring must stop that queue with a clear error
//! (logged, counted, signalled on the queue's err eventfd), the backend process must survive,
//! and other ports must keep working with exact counts. The hostile frontend lives here: it
//! speaks vhost-user through the `vhost` crate's `Frontend`, shares a memfd it maps itself,
//! lays out split rings by hand and writes raw bytes into them.

mod common;

use common::{assert_tx_to_sink_exact, backend, port, ports, run_frontend, u, Proc, EVENT, RUN};
use serde_json::Value;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Guest address of the memfd's first byte.
const GPA: u64 = 0x10_0000;
/// Size of the memfd.
const MEM_LEN: u64 = 64 << 10;
/// Descriptors per queue.
const QSZ: u16 = 16;
/// Ring offsets in the memfd, per queue (desc, avail, used).
const RINGS: [(u64, u64, u64); 2] = [(0, 256, 4096), (8192, 8192 + 256, 12288)];
/// Buffers: `QSZ` of `BUF` bytes from here.
const BUFS: u64 = 16384;
const BUF: u64 = 2048;

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const RX: usize = 0;
const TX: usize = 1;

/// A memfd mapped shared into this process; unmapped on drop.
struct Shm {
    file: File,
    base: NonNull<u8>,
    len: usize,
}

impl Shm {
    fn new(len: u64) -> Self {
        // SAFETY: a valid C string; the returned fd is checked, then owned by the File.
        let fd = unsafe { libc::memfd_create(c"pvnet-hostile".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: fd is fresh and owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len).expect("ftruncate memfd");
        let len = usize::try_from(len).expect("length fits usize");
        // SAFETY: a new shared mapping of our own memfd chosen by the kernel; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let base = NonNull::new(p.cast::<u8>()).expect("mmap returned null");
        Self { file, base, len }
    }

    fn ptr(&self, off: u64, n: usize) -> *mut u8 {
        let off = usize::try_from(off).expect("offset fits usize");
        assert!(off + n <= self.len, "write outside our mapping");
        // SAFETY: off + n <= len (checked above): inside the mapping.
        unsafe { self.base.as_ptr().add(off) }
    }

    fn write<const N: usize>(&self, off: u64, bytes: [u8; N]) {
        let p = self.ptr(off, N);
        for (i, b) in bytes.into_iter().enumerate() {
            // SAFETY: p..p+N is inside our live mapping (checked in `ptr`); volatile because
            // the backend process reads this memory concurrently.
            unsafe { p.add(i).write_volatile(b) };
        }
    }

    /// One store of the little-endian u16 `v` at `off` (2-aligned), released after every
    /// write before it: an index the backend process reads is never seen half written.
    fn write16(&self, off: u64, v: u16) {
        assert_eq!(off % 2, 0, "unaligned u16 at {off}");
        let p = self.ptr(off, 2);
        // SAFETY: as in `read16`.
        let a = unsafe { &*p.cast::<std::sync::atomic::AtomicU16>() };
        a.store(v.to_le(), Ordering::Release);
    }

    /// One load of the little-endian u16 at `off` (2-aligned): a value the backend process
    /// is changing is read whole, never half old and half new.
    fn read16(&self, off: u64) -> u16 {
        assert_eq!(off % 2, 0, "unaligned u16 at {off}");
        let p = self.ptr(off, 2);
        // SAFETY: p..p+2 is inside our live mapping (checked in `ptr`) and 2-aligned (the
        // mapping is page-aligned); an atomic view of shared memory another process writes.
        let a = unsafe { &*p.cast::<std::sync::atomic::AtomicU16>() };
        u16::from_le(a.load(Ordering::Acquire))
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`; nothing refers to it any more.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Where a hostile frontend's rings live and how large they are.
#[derive(Debug, Clone)]
struct Layout {
    /// Size of the memfd.
    mem: u64,
    /// Descriptors per queue.
    qsz: u16,
    /// Ring offsets in the memfd, per queue (desc, avail, used): queue pair `k` is queues
    /// `2k` (receive) and `2k + 1` (transmit).
    rings: Vec<(u64, u64, u64)>,
    /// More memory regions in the table after the rings' own: memfds of 1 MiB, nothing in
    /// them used.
    regions: usize,
}

/// The layout of most cases: `QSZ` descriptors, `RINGS`, `MEM_LEN` bytes.
fn small() -> Layout {
    Layout {
        mem: MEM_LEN,
        qsz: QSZ,
        rings: RINGS.to_vec(),
        regions: 0,
    }
}

/// A frontend that negotiates like `NetClient::connect` and then writes whatever it likes.
struct Hostile {
    fe: Frontend,
    /// With `VIRTIO_F_ACCESS_PLATFORM`: a clone of the main socket (for IOTLB messages the
    /// crate does not send) and our end of the backend request channel.
    iommu: Option<(UnixStream, UnixStream)>,
    shm: Shm,
    lay: Layout,
    kick: Vec<EventFd>,
    call: Vec<EventFd>,
    err: Vec<EventFd>,
}

impl Hostile {
    /// Connects and brings both queues up; `declared` is the region size announced in
    /// SET_MEM_TABLE (normally `MEM_LEN`). Returns the error if SET_MEM_TABLE is refused.
    fn connect(sock: &Path, declared: u64) -> Result<Self, vhost::Error> {
        Self::connect_with(sock, declared, 0)
    }

    /// As [`connect`](Self::connect), also acking the feature bits `extra`.
    fn connect_with(sock: &Path, declared: u64, extra: u64) -> Result<Self, vhost::Error> {
        Self::connect_order(sock, declared, extra, false)
    }

    /// As [`connect_with`](Self::connect_with); `mem_last`: every ring set up and enabled
    /// before SET_MEM_TABLE (the protocol does not order them; QEMU and DPDK send the table
    /// first).
    fn connect_order(
        sock: &Path,
        declared: u64,
        extra: u64,
        mem_last: bool,
    ) -> Result<Self, vhost::Error> {
        Self::connect_layout(sock, declared, extra, mem_last, small())
    }

    /// As [`connect_order`](Self::connect_order), with rings and memory laid out by `lay`.
    fn connect_layout(
        sock: &Path,
        declared: u64,
        extra: u64,
        mem_last: bool,
        lay: Layout,
    ) -> Result<Self, vhost::Error> {
        let iommu = extra & VIRTIO_F_ACCESS_PLATFORM != 0;
        let stream = UnixStream::connect(sock).expect("connect");
        let raw = stream.try_clone().expect("socket clone");
        let mut fe = Frontend::from_stream(stream, lay.rings.len() as u64);
        fe.set_owner()?;
        let offered = fe.get_features()?;
        assert_ne!(offered & VIRTIO_F_VERSION_1, 0, "VERSION_1 offered");
        assert_ne!(
            offered & VHOST_USER_F_PROTOCOL_FEATURES,
            0,
            "protocol features offered"
        );
        assert_eq!(offered & extra, extra, "extra features offered");
        fe.set_features(VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES | extra)?;
        let p = fe.get_protocol_features()?;
        assert!(
            p.contains(VhostUserProtocolFeatures::REPLY_ACK),
            "REPLY_ACK offered: {p:?}"
        );
        let mut ask = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK;
        if iommu {
            ask |= VhostUserProtocolFeatures::BACKEND_REQ;
        }
        fe.set_protocol_features(p & ask)?;
        // Every request from here on is acknowledged: when a call returns, the backend has
        // handled it (and a refusal comes back as an error).
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);

        let shm = Shm::new(lay.mem);
        let uaddr = shm.base.as_ptr() as u64;
        let more: Vec<Shm> = (0..lay.regions).map(|_| Shm::new(1 << 20)).collect();
        let mut table = vec![VhostUserMemoryRegionInfo {
            guest_phys_addr: GPA,
            memory_size: declared,
            userspace_addr: uaddr,
            mmap_offset: 0,
            mmap_handle: shm.file.as_raw_fd(),
        }];
        // The others far above the first, 2 MiB apart.
        for (k, m) in more.iter().enumerate() {
            table.push(VhostUserMemoryRegionInfo {
                guest_phys_addr: (1 << 40) + (k as u64) * (2 << 20),
                memory_size: 1 << 20,
                userspace_addr: m.base.as_ptr() as u64,
                mmap_offset: 0,
                mmap_handle: m.file.as_raw_fd(),
            });
        }
        if !mem_last {
            fe.set_mem_table(&table)?;
        }
        let iommu = iommu.then(|| {
            let (ours, theirs) = UnixStream::pair().expect("socketpair");
            fe.set_backend_request_fd(&theirs)
                .expect("SET_BACKEND_REQ_FD");
            ours.set_nonblocking(true).expect("nonblocking");
            (raw, ours)
        });
        let evs = || {
            (0..lay.rings.len())
                .map(|_| EventFd::new(EFD_NONBLOCK).expect("eventfd"))
                .collect::<Vec<_>>()
        };
        let (kick, call, err) = (evs(), evs(), evs());
        let h = Self {
            fe,
            iommu,
            shm,
            lay,
            kick,
            call,
            err,
        };
        // The packed ring starts with its wrap counter at 1 (bit 15 of the base).
        let base = if extra & VIRTIO_F_RING_PACKED != 0 {
            0x8000
        } else {
            0
        };
        for (q, &(desc, avail, used)) in h.lay.rings.iter().enumerate() {
            if h.iommu.is_some() {
                // Rings granted for good, at IOVA = our user address.
                h.iotlb(
                    IOTLB_UPDATE,
                    uaddr + desc,
                    used + 4096 - desc,
                    uaddr + desc,
                    3,
                );
            }
            h.fe.set_vring_num(q, h.lay.qsz)?;
            h.fe.set_vring_base(q, base)?;
            h.fe.set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: h.lay.qsz,
                    queue_size: h.lay.qsz,
                    flags: 0,
                    desc_table_addr: uaddr + desc,
                    used_ring_addr: uaddr + used,
                    avail_ring_addr: uaddr + avail,
                    log_addr: None,
                },
            )?;
            h.fe.set_vring_call(q, &h.call[q])?;
            h.fe.set_vring_err(q, &h.err[q])?;
            h.fe.set_vring_kick(q, &h.kick[q])?;
        }
        let mut h = h;
        for q in 0..h.lay.rings.len() {
            h.fe.set_vring_enable(q, true)?;
        }
        if mem_last {
            h.fe.set_mem_table(&table)?;
        }
        Ok(h)
    }

    /// Sends one `VHOST_USER_IOTLB_MSG` (need-reply) and checks the ack.
    fn iotlb(&self, kind: u8, iova: u64, size: u64, uaddr: u64, perm: u8) {
        let (raw, _) = self.iommu.as_ref().expect("IOMMU negotiated");
        let mut m = Vec::with_capacity(44);
        m.extend_from_slice(&22u32.to_le_bytes());
        m.extend_from_slice(&(1u32 | 8).to_le_bytes());
        m.extend_from_slice(&32u32.to_le_bytes());
        m.extend_from_slice(&iova.to_le_bytes());
        m.extend_from_slice(&size.to_le_bytes());
        m.extend_from_slice(&uaddr.to_le_bytes());
        m.extend_from_slice(&[perm, kind, 0, 0, 0, 0, 0, 0]);
        (&*raw).write_all(&m).expect("IOTLB message");
        let mut ack = [0u8; 20];
        (&*raw).read_exact(&mut ack).expect("IOTLB ack");
        assert_eq!(&ack[12..], &[0u8; 8], "IOTLB message acked with success");
    }

    /// The (type, iova, perm) of every backend-channel IOTLB message waiting.
    /// The backend's messages, waiting up to `limit` for the first.
    fn backend_msgs_within(&self, limit: Duration) -> Vec<(u8, u64, u8)> {
        let until = Instant::now() + limit;
        loop {
            let m = self.backend_msgs();
            if !m.is_empty() || Instant::now() > until {
                return m;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn backend_msgs(&self) -> Vec<(u8, u64, u8)> {
        let (_, chan) = self.iommu.as_ref().expect("IOMMU negotiated");
        let mut out = Vec::new();
        let mut m = [0u8; 44];
        while (&*chan).read_exact(&mut m).is_ok() {
            assert_eq!(
                &m[0..4],
                &1u32.to_le_bytes(),
                "VHOST_USER_BACKEND_IOTLB_MSG"
            );
            let iova = u64::from_le_bytes(m[12..20].try_into().unwrap());
            out.push((m[37], iova, m[36]));
        }
        out
    }

    /// Our user address of offset `off` of the memfd (the IOVA the IOMMU cases use for it).
    fn user(&self, off: u64) -> u64 {
        self.shm.base.as_ptr() as u64 + off
    }

    /// Guest address of buffer `i`.
    fn buf(i: u64) -> u64 {
        GPA + BUFS + i * BUF
    }

    fn set_desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let off = self.lay.rings[q].0 + 16 * u64::from(i);
        self.shm.write(off, addr.to_le_bytes());
        self.shm.write(off + 8, len.to_le_bytes());
        self.shm.write(off + 12, flags.to_le_bytes());
        self.shm.write(off + 14, next.to_le_bytes());
    }

    /// Writes avail ring slot `slot` (no wrap: the tests stay in the first lap).
    fn set_avail_entry(&self, q: usize, slot: u16, head: u16) {
        self.shm.write(
            self.lay.rings[q].1 + 4 + 2 * u64::from(slot),
            head.to_le_bytes(),
        );
    }

    /// Publishes `avail->idx = idx` (after the entries and descriptors) and kicks.
    fn publish_and_kick(&self, q: usize, idx: u16) {
        // Release: entries and descriptors above are written before the index.
        fence(Ordering::Release);
        self.shm.write16(self.lay.rings[q].1 + 2, idx);
        fence(Ordering::SeqCst);
        self.kick[q].write(1).expect("kick");
    }

    fn used_idx(&self, q: usize) -> u16 {
        self.shm.read16(self.lay.rings[q].2 + 2)
    }

    /// Waits up to `limit` for queue `q`'s used index to reach `n`; returns whether it did.
    fn wait_used(&self, q: usize, n: u16, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while self.used_idx(q) != n {
            if Instant::now() > until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Waits until queue `q`'s err eventfd is readable; returns its counter.
    fn wait_err(&self, q: usize, timeout: Duration) -> u64 {
        assert!(
            poll_readable(self.err[q].as_raw_fd(), timeout),
            "err eventfd of queue {q} not signalled within {timeout:?}"
        );
        self.err[q].read().expect("read err eventfd")
    }

    /// The err eventfd's counter if signalled, without waiting.
    fn err_now(&self, q: usize) -> Option<u64> {
        self.err[q].read().ok()
    }
}

/// poll(2) for POLLIN on one fd, bounded.
fn poll_readable(fd: i32, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on a live fd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            return p.revents & libc::POLLIN != 0;
        }
        if r == 0 || Instant::now() >= until {
            return false;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
    }
}

/// Runs a normal frontend (`--role tx --secs 0.3`) against the backend and returns its
/// `final` object; the caller checks it against the backend's port entry.
fn good_tx(sock: &Path) -> Value {
    run_frontend("good frontend", sock, &["--role", "tx", "--secs", "0.3"])
}

/// SIGTERM, clean exit, `final` JSON.
fn stop_backend(b: &mut Proc) -> Value {
    assert!(b.alive(), "backend died\n{}", b.stderr());
    b.signal(libc::SIGTERM);
    let st = b.wait_exit(RUN);
    assert!(
        st.success(),
        "backend exit after SIGTERM: {st}\n{}",
        b.stderr()
    );
    b.final_json()
}

/// One malformed-TX-ring case against `pvnet backend --role sink`: `corrupt` writes the bad
/// ring state; the backend must log `queue stopped: <...expect...>`, signal the TX err fd,
/// survive, keep serving a good frontend exactly, and count one queue error on the port.
fn sink_case(tag: &str, corrupt: impl FnOnce(&Hostile), expect: &[&str]) {
    let dir = common::TestDir::new(tag);
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    let h = Hostile::connect(&sock, MEM_LEN).expect("hostile frontend connects");
    corrupt(&h);

    let line = b.wait_stderr("queue stopped:", EVENT);
    eprintln!("{tag}: {line}");
    for e in expect {
        assert!(
            line.contains(e),
            "queue-stopped message should mention {e:?}: {line}"
        );
    }
    assert!(line.contains("port=0"), "names the port: {line}");
    assert!(line.contains("queue=1"), "names the queue: {line}");
    let v = h.wait_err(TX, EVENT);
    assert!(v >= 1, "err eventfd counter {v}");
    assert_eq!(h.err_now(RX), None, "the RX queue was not failed");
    assert_eq!(h.used_idx(TX), 0, "nothing of the bad ring was completed");
    assert!(b.alive(), "backend died\n{}", b.stderr());

    // The backend keeps serving other ports while the hostile connection stays open.
    let good = good_tx(&sock);
    assert!(b.alive(), "backend died\n{}", b.stderr());
    drop(h);

    let fin = stop_backend(&mut b);
    assert_eq!(ports(&fin).len(), 2, "{fin}");
    let hp = port(&fin, 0);
    assert_eq!(u(&hp, "/queue_errors"), 1, "hostile port: {hp}");
    assert_eq!(u(&hp, "/rx_packets"), 0, "hostile port: {hp}");
    assert_tx_to_sink_exact(&good, &port(&fin, 1), 64);
    assert_eq!(b.stderr_lines("queue stopped:").len(), 1, "{}", b.stderr());
}

/// Bit 34: the packed virtqueue.
const VIRTIO_F_RING_PACKED: u64 = 1 << 34;
/// Packed descriptor flags: available with wrap counter 1, writable, chained.
const P_AVAIL: u16 = 1 << 7;
const P_WRITE: u16 = 2;

impl Hostile {
    /// A packed descriptor in slot `i` of queue `q`'s ring (flags last).
    fn set_packed(&self, q: usize, i: u16, addr: u64, len: u32, id: u16, flags: u16) {
        let off = self.lay.rings[q].0 + 16 * u64::from(i);
        self.shm.write(off, addr.to_le_bytes());
        self.shm.write(off + 8, len.to_le_bytes());
        self.shm.write(off + 12, id.to_le_bytes());
        // Release: the body is written before the flags make it available.
        fence(Ordering::Release);
        self.shm.write(off + 14, flags.to_le_bytes());
        fence(Ordering::SeqCst);
    }

    fn packed_flags(&self, q: usize, i: u16) -> u16 {
        self.shm
            .read16(self.lay.rings[q].0 + 16 * u64::from(i) + 14)
    }
}

/// A hostile frontend on the packed ring breaks a rule on its transmit queue: that queue
/// stops with the reason, nothing of it is marked used, the receive queue and other ports go
/// on, the counters say so.
fn packed_case(tag: &str, corrupt: impl FnOnce(&Hostile), expect: &str) {
    let dir = common::TestDir::new(tag);
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    let h = Hostile::connect_with(&sock, MEM_LEN, VIRTIO_F_RING_PACKED)
        .expect("hostile frontend connects with the packed ring");
    corrupt(&h);
    h.kick[TX].write(1).expect("kick");
    let line = b.wait_stderr("queue stopped:", EVENT);
    eprintln!("{tag}: {line}");
    assert!(
        line.contains(expect),
        "queue-stopped message should mention {expect:?}: {line}"
    );
    assert!(
        line.contains("port=0") && line.contains("queue=1"),
        "{line}"
    );
    assert!(h.wait_err(TX, EVENT) >= 1);
    assert_eq!(h.err_now(RX), None, "the RX queue was not failed");
    assert_eq!(h.packed_flags(TX, 0) & (1 << 15), 0, "nothing marked used");
    let good = good_tx(&sock);
    assert!(b.alive(), "backend died\n{}", b.stderr());
    drop(h);
    let fin = stop_backend(&mut b);
    let hp = port(&fin, 0);
    assert_eq!(u(&hp, "/queue_errors"), 1, "hostile port: {hp}");
    assert_eq!(u(&hp, "/rx_packets"), 0, "hostile port: {hp}");
    assert_tx_to_sink_exact(&good, &port(&fin, 1), 64);
}

#[test]
fn packed_buffer_id_out_of_range() {
    packed_case(
        "pid",
        |h| h.set_packed(TX, 0, Hostile::buf(0), 64, QSZ + 3, P_AVAIL),
        "descriptor index 19 out of range",
    );
}

#[test]
fn packed_address_outside_shared_memory() {
    packed_case(
        "paddr",
        |h| h.set_packed(TX, 0, GPA + (16 << 20), 64, 0, P_AVAIL),
        "is not in any shared memory region",
    );
}

#[test]
fn packed_writable_descriptor_on_tx_queue() {
    packed_case(
        "pwr",
        |h| h.set_packed(TX, 0, Hostile::buf(0), 64, 0, P_AVAIL | P_WRITE),
        "direction mismatch",
    );
}

#[test]
fn descriptor_index_out_of_range() {
    sink_case(
        "didx",
        |h| {
            h.set_avail_entry(TX, 0, QSZ + 3);
            h.publish_and_kick(TX, 1);
        },
        &["descriptor index 19 out of range", "16"],
    );
}

#[test]
fn descriptor_address_outside_shared_memory() {
    let addr = GPA + (16 << 20);
    sink_case(
        "daddr",
        |h| {
            h.set_desc(TX, 0, addr, 64, 0, 0);
            h.set_avail_entry(TX, 0, 0);
            h.publish_and_kick(TX, 1);
        },
        &["not in any shared memory region", &format!("{addr:#x}")],
    );
}

#[test]
fn descriptor_straddles_end_of_shared_memory() {
    // Starts inside the region, ends 56 bytes past it: a start-only check would miss it.
    let addr = GPA + MEM_LEN - 8;
    sink_case(
        "dstrad",
        |h| {
            h.set_desc(TX, 0, addr, 64, 0, 0);
            h.set_avail_entry(TX, 0, 0);
            h.publish_and_kick(TX, 1);
        },
        // The error names the first byte outside shared memory.
        &[
            "not in any shared memory region",
            &format!("{:#x}", GPA + MEM_LEN),
        ],
    );
}

#[test]
fn descriptor_chain_loop() {
    sink_case(
        "loop",
        |h| {
            h.set_desc(TX, 0, Hostile::buf(0), 64, DESC_F_NEXT, 0);
            h.set_avail_entry(TX, 0, 0);
            h.publish_and_kick(TX, 1);
        },
        &["chain longer than 16", "loop"],
    );
}

#[test]
fn avail_idx_jump() {
    sink_case(
        "ajump",
        |h| {
            for i in 0..QSZ {
                h.set_desc(TX, i, Hostile::buf(u64::from(i)), 64, 0, 0);
                h.set_avail_entry(TX, i, i);
            }
            h.publish_and_kick(TX, QSZ + 5);
        },
        &["avail index jumped from 0 to 21", "queue size 16"],
    );
}

#[test]
fn writable_descriptor_on_tx_queue() {
    sink_case(
        "wrtx",
        |h| {
            h.set_desc(TX, 0, Hostile::buf(0), 64, DESC_F_WRITE, 0);
            h.set_avail_entry(TX, 0, 0);
            h.publish_and_kick(TX, 1);
        },
        &["direction mismatch", "writable descriptor", "device-reads"],
    );
}

#[test]
fn readable_descriptor_on_rx_queue_of_generator() {
    // The device-writes side: a generator backend fills the frontend's RX ring.
    let dir = common::TestDir::new("rdrx");
    let (mut b, sock) = backend(&dir, "b", &["--role", "gen", "--secs", "0.3"]);
    let h = Hostile::connect(&sock, MEM_LEN).expect("hostile frontend connects");
    h.set_desc(RX, 0, Hostile::buf(0), 2048, 0, 0);
    h.set_avail_entry(RX, 0, 0);
    h.publish_and_kick(RX, 1);
    let line = b.wait_stderr("queue stopped:", EVENT);
    assert!(
        line.contains("readable descriptor") && line.contains("device-writes"),
        "{line}"
    );
    assert!(line.contains("queue=0"), "{line}");
    assert!(h.wait_err(RX, EVENT) >= 1);
    assert_eq!(h.err_now(TX), None, "the TX queue was not failed");
    assert_eq!(h.used_idx(RX), 0);

    let good = run_frontend("good frontend", &sock, &["--role", "rx"]);
    drop(h);
    let fin = stop_backend(&mut b);
    let hp = port(&fin, 0);
    assert_eq!(u(&hp, "/queue_errors"), 1, "{hp}");
    assert_eq!(u(&hp, "/tx_packets"), 0, "{hp}");
    let gp = port(&fin, 1);
    // Frames delivered: data and the end marker.
    let frames = u(&gp, "/tx_packets");
    assert!(frames > 1, "{gp}");
    let sent = frames - 1;
    assert_eq!(u(&good, "/rx_packets"), frames, "{good}\n{gp}");
    assert_eq!(u(&good, "/data_received"), sent, "{good}\n{gp}");
    assert_eq!(u(&good, "/end_count"), sent, "{good}");
    assert_eq!(good["complete"], Value::Bool(true), "{good}");
    assert_eq!(u(&gp, "/queue_errors"), 0, "{gp}");
}

#[test]
fn garbage_on_the_socket() {
    let dir = common::TestDir::new("garbage");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);

    let header = |code: u32, flags: u32, size: u32| -> Vec<u8> {
        [code, flags, size]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    };
    // 1. Bytes that are no vhost-user message at all.
    let junk: Vec<u8> = (0..512u32)
        .map(|i| (i.wrapping_mul(151) ^ 0xa5).to_le_bytes()[0])
        .collect();
    // 2. A header claiming a body far larger than any message (SET_MEM_TABLE, 256 MiB).
    let huge = header(5, 1, 256 << 20);
    // 3. SET_FEATURES with a truncated body, then the writer goes away.
    let mut short = header(2, 1, 8);
    short.extend_from_slice(&[0, 0, 0, 0]);
    // 4. A reply flag and a request code that does not exist.
    let mut bogus = header(0xdead, 0x5, 8);
    bogus.extend_from_slice(&[1; 8]);

    for (i, msg) in [junk, huge, short, bogus].iter().enumerate() {
        let mut s = UnixStream::connect(&sock).expect("connect");
        s.write_all(msg).expect("write garbage");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        // The backend ends the session: we see end of file (or a reset), never a hang.
        s.set_read_timeout(Some(EVENT)).expect("timeout");
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("case {i}: backend answered garbage with {n} bytes"),
            Err(e) => assert_eq!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset,
                "case {i}: waiting for the backend to close: {e}"
            ),
        }
        // The session is torn down completely: queues stopped, port removed.
        b.wait_stderr_count(&["port removed", &format!("port={i} ")], 1, EVENT);
        assert!(
            b.alive(),
            "backend died on garbage case {i}\n{}",
            b.stderr()
        );
    }

    let good = good_tx(&sock);
    let fin = stop_backend(&mut b);
    assert_tx_to_sink_exact(&good, &port(&fin, 4), 64);
}

/// Waits until the backend completed TX entry 0, stopped the queue, or died.
fn wait_consumed_or_stopped(h: &Hostile, b: &mut Proc) {
    let until = Instant::now() + EVENT;
    while h.used_idx(TX) == 0 && b.stderr_lines("queue stopped:").is_empty() && b.alive() {
        assert!(
            Instant::now() < until,
            "backend neither used nor rejected the buffer"
        );
        // Bounded poll of shared memory and the child: no single fd covers all three.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Panics with the backend's exit status and log if it is gone.
fn assert_alive(b: &mut Proc, what: &str) {
    if !b.alive() {
        let st = b.wait_exit(EVENT);
        panic!("backend died {what}: {st}\n{}", b.stderr());
    }
}

#[test]
fn mem_table_region_larger_than_memfd() {
    let dir = common::TestDir::new("bigreg");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    // Announce 1 MiB over a 64 KiB memfd. Accepting this maps pages past the file's end;
    // touching them raises SIGBUS in the backend unless it checked the file size.
    let declared = 1 << 20;
    match Hostile::connect(&sock, declared) {
        Err(e) => {
            // Refused: the session ends, the backend goes on.
            eprintln!("SET_MEM_TABLE refused: {e}");
        }
        Ok(h) => {
            // Accepted: aim a TX buffer past the memfd's end (inside the announced region).
            h.set_desc(TX, 0, GPA + MEM_LEN + 4096, 64, 0, 0);
            h.set_avail_entry(TX, 0, 0);
            h.publish_and_kick(TX, 1);
            wait_consumed_or_stopped(&h, &mut b);
            assert_alive(
                &mut b,
                &format!(
                    "on a buffer beyond the end of the frontend's memfd (SET_MEM_TABLE region of \
                     {declared} bytes over a {MEM_LEN}-byte memfd was accepted)"
                ),
            );
            drop(h);
        }
    }
    assert!(b.alive(), "backend died\n{}", b.stderr());
    let good = good_tx(&sock);
    let fin = stop_backend(&mut b);
    assert_tx_to_sink_exact(&good, &port(&fin, 1), 64);
}

#[test]
fn memfd_shrunk_after_mem_table() {
    // The frontend truncates its memfd after the backend mapped it: the access faults
    // (SIGBUS). pvnet must stop only that port's queue, with an error that says why.
    let dir = common::TestDir::new("shrink");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    let h = Hostile::connect(&sock, MEM_LEN).expect("hostile frontend connects");
    // The rings stay inside the first 16 KiB; the buffers are cut away under the backend
    // after it mapped them.
    h.shm.file.set_len(BUFS).expect("shrink memfd");
    h.set_desc(TX, 0, Hostile::buf(0), 64, 0, 0);
    h.set_avail_entry(TX, 0, 0);
    h.publish_and_kick(TX, 1);
    let line = b.wait_stderr("shared memory fault", EVENT);
    assert!(line.contains("queue stopped"), "{line}");
    assert_alive(
        &mut b,
        "reading a buffer the frontend truncated away after SET_MEM_TABLE",
    );
    let good = good_tx(&sock);
    drop(h);
    let fin = stop_backend(&mut b);
    // Both queues of the port share the memory that went away: both stop.
    assert_eq!(port(&fin, 0)["queue_errors"], 2, "{fin}");
    assert_tx_to_sink_exact(&good, &port(&fin, 1), 64);
}

#[test]
fn sigterm_with_a_silent_frontend_connected() {
    // A frontend that connects and then says nothing must not keep the backend from
    // stopping when it is told to.
    let dir = common::TestDir::new("silent");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    let s = UnixStream::connect(&sock).expect("connect");
    b.wait_stderr("frontend connected", EVENT);
    b.signal(libc::SIGTERM);
    let until = Instant::now() + Duration::from_secs(5);
    while b.alive() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    let alive = b.alive();
    drop(s);
    assert!(
        !alive,
        "backend still running 5 s after SIGTERM while a frontend holds its connection open"
    );
    let st = b.wait_exit(EVENT);
    assert!(st.success(), "{st}\n{}", b.stderr());
    let fin = b.final_json();
    assert_eq!(ports(&fin).len(), 1, "{fin}");
}

#[test]
fn rx_buffer_shorter_than_net_header() {
    // With VIRTIO_NET_F_MRG_RXBUF every receive buffer must hold the 12-byte virtio-net
    // header (virtio 1.x 5.1.6.3.1). One that cannot must stop the queue with a message that
    // says so.
    let dir = common::TestDir::new("shorthdr");
    let (mut b, sock) = backend(&dir, "b", &["--role", "gen", "--secs", "0.3"]);
    let h = Hostile::connect_with(&sock, MEM_LEN, VIRTIO_NET_F_MRG_RXBUF)
        .expect("hostile frontend connects");
    h.set_desc(RX, 0, Hostile::buf(0), 8, DESC_F_WRITE, 0);
    h.set_avail_entry(RX, 0, 0);
    for i in 1..QSZ {
        h.set_desc(RX, i, Hostile::buf(u64::from(i)), 2048, DESC_F_WRITE, 0);
        h.set_avail_entry(RX, i, i);
    }
    h.publish_and_kick(RX, QSZ);
    let line = b.wait_stderr("queue stopped:", EVENT);
    assert!(h.wait_err(RX, EVENT) >= 1);
    assert_alive(&mut b, "on a short receive buffer");
    drop(h);
    let _ = stop_backend(&mut b);
    let l = line.to_lowercase();
    assert!(
        l.contains("header") || l.contains("too small") || l.contains("short"),
        "the message should name the problem (a receive buffer smaller than the 12-byte \
         virtio-net header): {line}"
    );
}

#[test]
fn without_mrg_rxbuf_one_chain_per_packet() {
    // Conformance: when VIRTIO_NET_F_MRG_RXBUF is not negotiated the device must put each
    // packet in a single descriptor chain and set num_buffers to 1 (virtio 1.x 5.1.6.4.1; the
    // same fix in Linux vhost-net: "vhost/net: Set num_buffers for virtio 1.0"). A packet
    // that does not fit one chain is dropped, not spread over several.
    let dir = common::TestDir::new("nomrg");
    let (mut b, sock) = backend(
        &dir,
        "b",
        &["--role", "gen", "--secs", "0.2", "--frame-len", "200"],
    );
    let h = Hostile::connect(&sock, MEM_LEN).expect("hostile frontend connects");
    // 128-byte buffers: a 212-byte packet (header included) fits none of them.
    for i in 0..QSZ {
        h.set_desc(RX, i, Hostile::buf(u64::from(i)), 128, DESC_F_WRITE, 0);
        h.set_avail_entry(RX, i, i);
    }
    h.publish_and_kick(RX, QSZ);
    // A conforming device never uses these buffers, so this bound is the passing path; a
    // merging device uses them within milliseconds.
    let until = Instant::now() + Duration::from_secs(1);
    while h.used_idx(RX) == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_alive(&mut b, "");
    // End the session (queues stopped synchronously), then read what the device wrote.
    let Hostile { fe, shm, .. } = h;
    drop(fe);
    b.wait_stderr("port removed", EVENT);
    let used = shm.read16(RINGS[RX].2 + 2);
    let mut report = Vec::new();
    for slot in 0..used {
        let off = RINGS[RX].2 + 4 + 8 * u64::from(slot % QSZ);
        let id = u64::from(shm.read16(off));
        let len = shm.read16(off + 4);
        let nb = shm.read16(BUFS + id * BUF + 10);
        report.push((id, len, nb));
    }
    let _ = stop_backend(&mut b);
    assert!(
        report.iter().all(|&(_, len, nb)| nb == 1 && len <= 128),
        "without MRG_RXBUF every used entry must be a whole packet with num_buffers == 1; \
         got (id, len, num_buffers) = {report:?}"
    );
}

#[test]
fn a_ring_set_up_before_the_memory_table_starts_when_it_arrives() {
    // NUM, BASE, ADDR, CALL, ERR, KICK and ENABLE for both rings, then SET_MEM_TABLE: the
    // rings start when the table arrives, and a packet sent then is consumed.
    let dir = common::TestDir::new("memlast");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    let h = Hostile::connect_order(&sock, MEM_LEN, 0, true).expect("hostile frontend connects");
    let mut frame = [0u8; 12 + 64];
    frame[12..18].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    frame[18..24].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    h.shm.write(Hostile::buf(0) - GPA, frame);
    h.set_desc(TX, 0, Hostile::buf(0), 76, 0, 0);
    h.set_avail_entry(TX, 0, 0);
    h.publish_and_kick(TX, 1);
    wait_consumed_or_stopped(&h, &mut b);
    assert_eq!(
        h.used_idx(TX),
        1,
        "the ring started with the table\n{}",
        b.stderr()
    );
    assert!(
        b.stderr_lines("queue stopped:").is_empty(),
        "{}",
        b.stderr()
    );
    drop(h);
    let fin = stop_backend(&mut b);
    assert_eq!(u(&port(&fin, 0), "/rx_packets"), 1, "{fin}");
}

/// A peer cannot flood the log. 300 sessions that each break the protocol, then more
/// connections than the backend runs sessions at once (`MAX_SESSIONS`, 64: the rest refused),
/// write at most a burst of warnings plus one a second (`ratelimit`); every event is a line
/// or counted in the next line's `held_back`, and a good frontend is then served exactly.
#[test]
fn a_peer_cannot_flood_the_log() {
    const BURST: usize = 10; // pvnet_vhost::BURST
    const PEER_LINES: [&str; 3] = ["closing session", "request refused", "refusing a frontend"];
    let dir = common::TestDir::new("logflood");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    // A request code that does not exist, with the reply flag: the session ends with an
    // error line each time.
    let mut bogus = [0xdeadu32, 0x5, 8]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect::<Vec<u8>>();
    bogus.extend_from_slice(&[1; 8]);
    let broken_session = || {
        let mut s = UnixStream::connect(&sock).expect("connect");
        s.write_all(&bogus).expect("write");
        s.set_read_timeout(Some(EVENT)).expect("timeout");
        let _ = s.read(&mut [0u8; 16]); // the backend hangs up
    };
    let t0 = Instant::now();
    for _ in 0..300 {
        broken_session();
    }
    // Past the session limit: 64 silent sessions held open, 100 more refused.
    let held: Vec<UnixStream> = (0..164)
        .map(|_| UnixStream::connect(&sock).expect("connect"))
        .collect();
    b.wait_stderr_count(&["frontend connected"], 300 + 64, EVENT);
    let refused_until = Instant::now() + EVENT;
    while b.stderr_lines("refusing a frontend").is_empty() && Instant::now() < refused_until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = usize::try_from(t0.elapsed().as_secs()).unwrap_or(usize::MAX);
    let lines: usize = PEER_LINES.iter().map(|n| b.stderr_lines(n).len()).sum();
    assert!(
        lines > 0 && lines <= BURST + secs + 1,
        "{lines} peer-caused warnings in {secs} s (allowed: {BURST} + 1 a second)\n{}",
        b.stderr()
    );
    drop(held);
    // After a quiet second, the next line gets through and reports what was held back.
    std::thread::sleep(Duration::from_millis(1100));
    let closing = b.stderr_lines("closing session").len();
    broken_session();
    b.wait_stderr_count(&["closing session"], closing + 1, EVENT);
    // Every event is a line or counted in a later line's `held_back`: 300 broken sessions,
    // 100 refused connections, and the last broken session.
    let (written, held_back) =
        PEER_LINES
            .iter()
            .flat_map(|n| b.stderr_lines(n))
            .fold((0usize, 0usize), |(w, h), l| {
                let held = l
                    .split("held_back=")
                    .nth(1)
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or_else(|| panic!("no held_back count in: {l}"));
                (w + 1, h + held)
            });
    assert_eq!(
        written + held_back,
        300 + 100 + 1,
        "{written} lines + {held_back} held back\n{}",
        b.stderr()
    );
    assert!(b.alive(), "backend died\n{}", b.stderr());
    let good = good_tx(&sock);
    let fin = stop_backend(&mut b);
    let p = ports(&fin)
        .into_iter()
        .find(|p| p.get("rx_packets").and_then(Value::as_u64) > Some(0))
        .unwrap_or_else(|| panic!("no port took the good frontend's packets: {fin}"));
    assert_tx_to_sink_exact(&good, &p, 64);
}

/// The GSO amplification defect, end to end: a frontend (this test) that negotiated
/// `HOST_TSO4` keeps its transmit ring (256 entries) full of 64 KiB TCP packets with the
/// smallest `gso_size` pvnet accepts (88), addressed to a pvnet frontend that did not
/// negotiate TSO (so the switch cuts every one it can deliver into 728 segments). Meanwhile a generator port paced at
/// 20 kpps feeds a sink through the same switch thread: it must keep at least half its rate
/// (it kept ~1% before segmentation was budgeted per sender per round).
#[test]
fn a_gso_flood_leaves_a_paced_port_its_rate() {
    const RATE: f64 = 20_000.0;
    const WINDOW: Duration = Duration::from_millis(1500);
    const VIRTIO_NET_F_CSUM: u64 = 1 << 0;
    const VIRTIO_NET_F_HOST_TSO4: u64 = 1 << 11;
    let dir = common::TestDir::new("gsoflood");
    let sw = common::Switch::start(
        &dir,
        &["--port", "gen:name=g,rate=20000,dst=02:00:00:00:00:99"],
    );
    // b announces 02:00:00:00:00:04 so that the flood is unicast to it, and takes it as fast
    // as it can (the rx role reads every byte; it never sees an end marker: killed below).
    let rx = common::frontend(
        "frontend rx",
        &sw.b,
        &[
            "--role",
            "rx",
            "--announce",
            "--queue-size",
            "1024",
            "--idle-timeout",
            "60",
        ],
    );
    rx.wait_json("ready", EVENT);
    let until = Instant::now() + EVENT;
    while sw
        .ctl("macs")
        .to_string()
        .matches("02:00:00:00:00:04")
        .count()
        == 0
    {
        assert!(
            Instant::now() < until,
            "b's address not learned: {}",
            sw.ctl("macs")
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Rings of 256 (as a guest's), then one 64 KiB TCPv4 packet (the device only reads it)
    // that every transmit descriptor points at.
    const PKT: u64 = 32 << 10;
    let lay = Layout {
        mem: PKT + (64 << 10),
        qsz: 256,
        rings: vec![(0, 4096, 8192), (12288, 16384, 20480)],
        regions: 0,
    };
    let h = Hostile::connect_layout(
        &sw.a,
        lay.mem,
        VIRTIO_NET_F_CSUM | VIRTIO_NET_F_HOST_TSO4,
        false,
        lay.clone(),
    )
    .expect("hostile frontend connects");
    let payload = 64000;
    let mut pkt = vec![0u8; 12 + 54 + payload];
    let f = &mut pkt[12..];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 4]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x77]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&u16::try_from(40 + payload).unwrap().to_be_bytes());
    f[22] = 64;
    f[23] = 6; // TCP
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[46] = 5 << 4;
    f[47] = 0x10; // ACK
    for (i, chunk) in pkt.chunks(8).enumerate() {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h.shm.write(PKT + 8 * i as u64, w);
    }
    let len = u32::try_from(pkt.len()).unwrap();
    for i in 0..lay.qsz {
        h.set_desc(TX, i, GPA + PKT, len, 0, 0);
    }

    // Floods with `gso_size` for WINDOW; returns the paced port's share of its rate, the
    // packets cut for b and the packets refused at a (`offload`).
    let mut posted: u16 = 0;
    let mut flood = |gso_size: u16| {
        let mut hdr = [0u8; 12];
        pvnet_net::VnetHdr {
            flags: pvnet_net::VnetHdr::F_NEEDS_CSUM,
            gso_type: pvnet_net::VnetHdr::GSO_TCPV4,
            hdr_len: 54,
            gso_size,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 0,
        }
        .write(&mut hdr);
        h.shm.write(PKT, hdr);
        let paced = || u(&sw.counters("s"), "/tx_packets");
        let (s0, cut0, refused0) = (
            paced(),
            u(&sw.counters("b"), "/sw_gso"),
            u(&sw.counters("a"), "/drops_offload"),
        );
        let t0 = Instant::now();
        while t0.elapsed() < WINDOW {
            // Keep the ring full: every buffer the switch gave back is posted again at once.
            let used = h.used_idx(TX);
            let before = posted;
            while posted.wrapping_sub(used) < lay.qsz {
                h.set_avail_entry(TX, posted % lay.qsz, posted % lay.qsz);
                posted = posted.wrapping_add(1);
            }
            if posted != before {
                h.publish_and_kick(TX, posted);
            }
            std::hint::spin_loop();
        }
        let secs = t0.elapsed().as_secs_f64();
        let share = (paced() - s0) as f64 / (RATE * secs);
        let cut = u(&sw.counters("b"), "/sw_gso") - cut0;
        let refused = u(&sw.counters("a"), "/drops_offload") - refused0;
        println!(
            "gso_size {gso_size}: {cut} packets cut for b, {refused} refused, in {secs:.2} s; \
             the paced port kept {share:.3} of its rate"
        );
        (share, cut, refused)
    };
    // The smallest gso_size accepted: every packet b can take is cut, within the budget.
    let (share, cut, _) = flood(88);
    assert!(
        cut > 100,
        "the flood was not a flood: {cut} packets segmented"
    );
    assert!(
        share >= 0.5,
        "gso_size 88: the paced port kept {share:.3} of its rate"
    );
    // The reported defect (gso_size 1: 64 000 segments a packet): refused, not cut.
    let (share, cut, refused) = flood(1);
    assert!(
        refused > 100 && cut == 0,
        "gso_size 1: {refused} refused, {cut} cut"
    );
    assert!(
        share >= 0.5,
        "gso_size 1: the paced port kept {share:.3} of its rate"
    );
    assert!(
        h.err_now(TX).is_none(),
        "the flood's queue was stopped\n{}",
        sw.proc.stderr()
    );
    rx.signal(libc::SIGKILL);
    let mut sw = sw;
    assert!(sw.proc.alive(), "switch died\n{}", sw.proc.stderr());
}

/// The receiver of a switch's paced generator (`dst=02:00:00:00:00:04`): a frontend on `b`
/// that announces that address and reads everything, once the switch has learned it.
fn paced_receiver(sw: &common::Switch) -> Proc {
    let rx = common::frontend(
        "frontend rx",
        &sw.b,
        &["--role", "rx", "--announce", "--idle-timeout", "60"],
    );
    rx.wait_json("ready", EVENT);
    let until = Instant::now() + EVENT;
    while !sw.ctl("macs").to_string().contains("02:00:00:00:00:04") {
        assert!(Instant::now() < until, "b not learned: {}", sw.ctl("macs"));
        std::thread::sleep(Duration::from_millis(20));
    }
    rx
}

/// The switch's open fds and mapping lines (`/proc/PID`).
fn fds_and_maps(pid: i32) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().count())
        .unwrap_or(0);
    (fds, maps)
}

/// A hostile frontend on queue pair 3 of a multiqueue port (4 pairs) of a switch with two
/// workers: only that queue stops (its err eventfd, the log naming it, one queue error); the
/// port's other pairs keep moving packets, a paced port on the switch keeps its rate, and
/// when the frontend goes nothing of its session is left (fds, mappings).
#[test]
fn a_hostile_queue_pair_stops_alone_on_a_multiqueue_port() {
    const RATE: f64 = 20_000.0;
    const WINDOW: Duration = Duration::from_millis(1500);
    const VIRTIO_NET_F_MQ: u64 = 1 << 22;
    let dir = common::TestDir::new("mqhostile");
    let mq = dir.sock("mq");
    let mq_spec = format!("vhost-user:name=mq,socket={},queue_pairs=4", mq.display());
    let sw = common::Switch::start_env(
        &dir,
        &[
            "--workers",
            "2",
            "--port",
            &mq_spec,
            "--port",
            "gen:name=g,rate=20000,dst=02:00:00:00:00:04",
        ],
        &[("MALLOC_ARENA_MAX", "1")],
    );
    let swp = sw.proc.pid();
    let rx = paced_receiver(&sw);
    let workers = common::placement(&sw.ctl("ports"));
    println!("placement: {workers:?}");
    assert!(
        workers.iter().filter(|w| !w.is_empty()).count() == 2,
        "ports on both workers: {workers:?}"
    );
    // Four pairs: pair 0 where the small layout has it, pairs 1-3 above the buffers.
    let mut rings = RINGS.to_vec();
    for k in 0..6u64 {
        let b = (64 << 10) + k * (16 << 10);
        rings.push((b, b + 256, b + 4096));
    }
    let lay = Layout {
        mem: (64 << 10) + 6 * (16 << 10),
        qsz: QSZ,
        rings,
        regions: 0,
    };
    let connect = || {
        Hostile::connect_layout(&mq, lay.mem, VIRTIO_NET_F_MQ, false, lay.clone())
            .expect("hostile frontend connects with four pairs")
    };
    // A first session, as the faults test's warm-up: what the port keeps for the next one (a
    // session thread's stack, the allocator's thresholds) is there before the count.
    drop(connect());
    std::thread::sleep(Duration::from_millis(300));
    let before = fds_and_maps(swp);
    let h = connect();
    // A valid 60-byte frame (zero header) in buffer 0, for every transmit ring to point at.
    let mut f = [0u8; 72];
    f[12..18].copy_from_slice(&[2, 0, 0, 0, 0, 0x99]);
    f[18..24].copy_from_slice(&[2, 0, 0, 0, 0, 0x77]);
    f[24..26].copy_from_slice(&0x88b5u16.to_be_bytes());
    for (i, w) in f.chunks(8).enumerate() {
        h.shm
            .write(BUFS + 8 * i as u64, <[u8; 8]>::try_from(w).unwrap());
    }
    let mut posted = [0u16; 4];
    let mut send = |h: &Hostile, pair: usize, n: u16| {
        let q = 2 * pair + 1;
        for _ in 0..n {
            let i = posted[pair] % QSZ;
            h.set_desc(q, i, Hostile::buf(0), 72, 0, 0);
            h.set_avail_entry(q, i, i);
            posted[pair] += 1;
        }
        h.publish_and_kick(q, posted[pair]);
        assert!(
            h.wait_used(q, posted[pair], EVENT),
            "pair {pair}: {} of {} sent",
            h.used_idx(q),
            posted[pair]
        );
    };
    for pair in 0..3 {
        send(&h, pair, 8);
    }
    // Pair 3's transmit ring names a descriptor past its table.
    h.set_avail_entry(7, 0, QSZ + 3);
    h.publish_and_kick(7, 1);
    let line = sw.proc.wait_stderr("queue stopped:", EVENT);
    println!("{line}");
    assert!(line.contains("queue=7"), "names the queue: {line}");
    assert!(h.wait_err(7, EVENT) >= 1);
    assert_eq!(h.used_idx(7), 0, "nothing of the bad ring completed");

    // The other pairs go on, and the paced port keeps its rate, over a window.
    let paced = || u(&sw.counters("b"), "/tx_packets");
    let (p0, t0) = (paced(), Instant::now());
    while t0.elapsed() < WINDOW {
        for pair in 0..3 {
            send(&h, pair, 4);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let share = (paced() - p0) as f64 / (RATE * t0.elapsed().as_secs_f64());
    println!("the paced port kept {share:.3} of its rate");
    assert!(share >= 0.9, "the paced port kept {share:.3} of its rate");
    for q in 0..7 {
        assert_eq!(h.err_now(q), None, "queue {q} was not stopped");
    }
    let c = sw.counters("mq");
    assert_eq!(u(&c, "/queue_errors"), 1, "{c}");
    let sent: u64 = posted[..3].iter().map(|&n| u64::from(n)).sum();
    assert_eq!(u(&c, "/rx_packets"), sent, "every valid frame taken: {c}");
    assert_eq!(sw.proc.stderr_lines("queue stopped:").len(), 1);

    // The frontend goes: its session leaves nothing behind.
    drop(h);
    let until = Instant::now() + EVENT;
    while fds_and_maps(swp) != before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        fds_and_maps(swp),
        before,
        "fds and mappings after the session"
    );
    rx.signal(libc::SIGKILL);
    let mut sw = sw;
    assert!(sw.proc.alive(), "switch died\n{}", sw.proc.stderr());
}

/// The switch's resident memory in KiB (`VmRSS`).
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A frontend that asks for all it can: 64 queue pairs, every ring of 32768 entries, 32
/// memory regions, connecting and hanging up in a loop. The switch's memory stays bounded
/// (no growth from session to session; what one such session costs, printed) and a paced
/// port keeps its rate meanwhile. `PVNET_ATTACKS` sets the number of sessions (default 200).
#[test]
fn a_frontend_asking_for_everything_in_a_loop_leaves_the_memory_bounded() {
    const RATE: f64 = 20_000.0;
    const VIRTIO_NET_F_MQ: u64 = 1 << 22;
    const QMAX: u16 = 32768;
    let cycles: usize = std::env::var("PVNET_ATTACKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = common::TestDir::new("memattack");
    let big = dir.sock("big");
    let spec = format!(
        "vhost-user:name=big,socket={},queue_pairs=64",
        big.display()
    );
    let sw = common::Switch::start_env(
        &dir,
        &[
            "--port",
            &spec,
            "--port",
            "gen:name=g,rate=20000,dst=02:00:00:00:00:04",
        ],
        &[],
    );
    let pid = sw.proc.pid();
    let rx = paced_receiver(&sw);
    // 128 rings of 32768 entries, 1 MiB apart from 1 MiB up (desc 512 KiB, avail 64 KiB and
    // 6 bytes, used 256 KiB and 6), in a sparse memfd nothing but the backend's reads touch.
    let lay = Layout {
        mem: 129 << 20,
        qsz: QMAX,
        rings: (0..128u64)
            .map(|q| {
                let b = (1 + q) << 20;
                (b, b + (512 << 10), b + (640 << 10))
            })
            .collect(),
        regions: 31,
    };
    let idle = rss_kib(pid);
    let paced = || u(&sw.counters("b"), "/tx_packets");
    let (p0, t0) = (paced(), Instant::now());
    let (mut most, mut at) = (0, Vec::new());
    for c in 0..cycles {
        let h = Hostile::connect_layout(&big, lay.mem, VIRTIO_NET_F_MQ, false, lay.clone())
            .unwrap_or_else(|e| panic!("session {c}: {e:?}\n{}", sw.proc.stderr()));
        most = most.max(rss_kib(pid));
        drop(h);
        // Wait for the session to end (the port free again) before the next.
        let until = Instant::now() + EVENT;
        while common::port_named(&sw.ctl("ports"), "big")["state"] != "waiting"
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        at.push(rss_kib(pid));
        if std::env::var("PVNET_ATTACK_TRACE").is_ok() {
            let (f, m) = fds_and_maps(pid);
            println!("session {c}: rss {} fds {f} maps {m}", rss_kib(pid));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let share = (paced() - p0) as f64 / (RATE * secs);
    let (half, end) = (at[cycles / 2], rss_kib(pid));
    println!(
        "{cycles} sessions of 64 pairs x 32768-entry rings and 32 regions in {secs:.1} s: RSS \
         idle {idle} KiB, half-way {half}, at most while one was attached {most}, at the end \
         {end} (each session's end: {at:?}); the paced port kept {share:.3} of its rate"
    );
    assert!(share >= 0.9, "the paced port kept {share:.3} of its rate");
    // The allocator settles within the first sessions; after that nothing may grow (it grew
    // ~270 KiB a session under glibc's dynamic mmap threshold: see proc::bound_heap).
    assert!(
        end <= half + 512,
        "RSS grew from {half} to {end} KiB over the last {} sessions",
        cycles - cycles / 2
    );
    assert!(
        most <= idle + 64 * 1024,
        "one session cost {} KiB of RSS",
        most - idle
    );
    let c = sw.counters("big");
    assert_eq!(u(&c, "/queue_errors"), 0, "{c}");
    rx.signal(libc::SIGKILL);
    let mut sw = sw;
    assert!(sw.proc.alive(), "switch died\n{}", sw.proc.stderr());
}

/// Bit 33: the device goes through an IOMMU (the vhost-user IOTLB).
const VIRTIO_F_ACCESS_PLATFORM: u64 = 1 << 33;
const IOTLB_MISS: u8 = 1;
const IOTLB_UPDATE: u8 = 2;
const IOTLB_INVALIDATE: u8 = 3;
const IOTLB_ACCESS_FAIL: u8 = 4;

/// Under an IOMMU the backend touches only what is granted: a granted buffer is consumed; once
/// revoked the same buffer is not (no byte read, nothing marked used); the backend asks for it
/// on the backend channel, at a bounded rate, and after its bound stops that queue with the
/// reason. The process and other ports go on; the counters say what happened.
#[test]
fn iommu_revoked_range_is_refused_and_misses_are_bounded() {
    let dir = common::TestDir::new("iommu-miss");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    let h = Hostile::connect_with(&sock, MEM_LEN, VIRTIO_F_ACCESS_PLATFORM).expect("connects");
    let iova = h.user(BUFS);
    h.iotlb(IOTLB_UPDATE, iova, BUF, iova, 1);
    h.set_desc(TX, 0, iova, 64, 0, 0);
    h.set_avail_entry(TX, 0, 0);
    h.publish_and_kick(TX, 1);
    assert!(h.wait_used(TX, 1, EVENT), "granted buffer not consumed");
    // Revoked: posting it again is a miss, never a read.
    h.iotlb(IOTLB_INVALIDATE, iova, BUF, 0, 0);
    h.set_avail_entry(TX, 1, 0);
    h.publish_and_kick(TX, 2);
    let line = b.wait_stderr("queue stopped:", EVENT);
    assert!(line.contains("no translation for"), "{line}");
    assert!(line.contains("queue=1"), "{line}");
    assert_eq!(h.used_idx(TX), 1, "the revoked buffer was not completed");
    assert!(h.wait_err(TX, EVENT) >= 1);
    let msgs = h.backend_msgs();
    assert!(!msgs.is_empty(), "the backend asked for the range");
    assert!(
        msgs.iter()
            .all(|&(t, a, p)| t == IOTLB_MISS && a == iova && p == 1),
        "{msgs:?}"
    );
    // Asked again every 20 ms for at most the 1 s bound: a bounded flood.
    assert!(msgs.len() <= 60, "{} misses", msgs.len());

    // Everything else goes on.
    let good = good_tx(&sock);
    assert!(b.alive(), "backend died\n{}", b.stderr());
    drop(h);
    let fin = stop_backend(&mut b);
    let hp = port(&fin, 0);
    assert_eq!(u(&hp, "/queue_errors"), 1, "{hp}");
    assert_eq!(u(&hp, "/rx_packets"), 1, "only the granted one: {hp}");
    assert_eq!(u(&hp, "/iotlb_misses"), msgs.len() as u64, "{hp}");
    assert_tx_to_sink_exact(&good, &port(&fin, 1), 64);
}

/// A whole-space invalidation (a vIOMMU's domain flush: Linux's lazy mode, which QEMU 8.0 and
/// later forward as an invalidation of everything) takes the rings' translations too. The
/// rings are parked, untouched, and asked for; once granted again the queue goes on with
/// nothing lost. Left unanswered, the queue stops after the miss bound, with a bounded number
/// of requests.
#[test]
fn iommu_ring_invalidated_by_a_flush_is_asked_for_and_goes_on() {
    let dir = common::TestDir::new("iommu-flush");
    let (mut b, sock) = backend(&dir, "b", &["--role", "sink"]);
    let h = Hostile::connect_with(&sock, MEM_LEN, VIRTIO_F_ACCESS_PLATFORM).expect("connects");
    let iova = h.user(BUFS);
    let post = |n: u16| {
        h.set_desc(TX, n % h.lay.qsz, iova, 64, 0, 0);
        h.set_avail_entry(TX, n % h.lay.qsz, n % h.lay.qsz);
        h.publish_and_kick(TX, n + 1);
    };
    let consumed = |n: u16, b: &Proc| {
        assert!(
            h.wait_used(TX, n, EVENT),
            "{n} not consumed\n{}",
            b.stderr()
        );
    };
    h.iotlb(IOTLB_UPDATE, iova, BUF, iova, 1);
    post(0);
    consumed(1, &b);
    // The flush: everything, the rings included. A sleeping worker applies it when the next
    // kick wakes it, and then finds its rings gone.
    h.iotlb(IOTLB_INVALIDATE, 0, 0, 0, 0);
    post(1);
    let msgs = h.backend_msgs_within(EVENT);
    let rings = |a: u64| {
        h.lay
            .rings
            .iter()
            .any(|&(desc, _, used)| a >= h.user(desc) && a < h.user(used) + 4096)
    };
    assert!(!msgs.is_empty(), "the backend asked for its rings");
    assert!(
        msgs.iter().all(|&(t, a, _)| t == IOTLB_MISS && rings(a)),
        "{msgs:?}"
    );
    // Granted again (as QEMU answers a miss from the guest's page tables): it goes on.
    for &(desc, _, used) in &h.lay.rings {
        h.iotlb(
            IOTLB_UPDATE,
            h.user(desc),
            used + 4096 - desc,
            h.user(desc),
            3,
        );
    }
    h.iotlb(IOTLB_UPDATE, iova, BUF, iova, 1);
    consumed(2, &b);
    post(2);
    consumed(3, &b);
    assert!(h.err_now(TX).is_none(), "no queue stopped\n{}", b.stderr());

    // A flush never answered: the queue stops after the bound, having asked at a bounded rate.
    h.iotlb(IOTLB_INVALIDATE, 0, 0, 0, 0);
    post(3);
    let line = b.wait_stderr("queue stopped:", Duration::from_secs(5));
    assert!(line.contains("revoked while the queue runs"), "{line}");
    let asked = h.backend_msgs();
    assert!(
        !asked.is_empty() && asked.len() <= 2 * 60,
        "{} misses for two rings over the bound",
        asked.len()
    );
    assert_eq!(h.used_idx(TX), 3, "nothing taken from a parked ring");
    assert!(b.alive(), "backend died\n{}", b.stderr());
    drop(h);
    let fin = stop_backend(&mut b);
    let hp = port(&fin, 0);
    assert_eq!(u(&hp, "/rx_packets"), 3, "{hp}");
    assert_eq!(
        u(&hp, "/queue_errors"),
        2,
        "both rings, after the bound: {hp}"
    );
    assert_eq!(
        u(&hp, "/rings_parked"),
        4,
        "both rings, at both flushes: {hp}"
    );
}

/// A write into a read-only grant is refused for good: the receive queue stops with the
/// reason, nothing is written, and the frontend is told (ACCESS_FAIL).
#[test]
fn iommu_write_into_read_only_grant_is_refused() {
    let dir = common::TestDir::new("iommu-ro");
    let (mut b, sock) = backend(&dir, "b", &["--role", "gen", "--secs", "5"]);
    let h = Hostile::connect_with(&sock, MEM_LEN, VIRTIO_F_ACCESS_PLATFORM).expect("connects");
    let iova = h.user(BUFS);
    h.iotlb(IOTLB_UPDATE, iova, BUF, iova, 1);
    h.shm.write(BUFS, [0xaau8; 16]);
    h.set_desc(RX, 0, iova, 2048, DESC_F_WRITE, 0);
    h.set_avail_entry(RX, 0, 0);
    h.publish_and_kick(RX, 1);
    let line = b.wait_stderr("queue stopped:", EVENT);
    assert!(line.contains("not allowed by its grant"), "{line}");
    assert!(line.contains("queue=0"), "{line}");
    assert_eq!(h.used_idx(RX), 0);
    let mut head = [0u8; 16];
    // SAFETY: inside our own mapping.
    unsafe { std::ptr::copy_nonoverlapping(h.shm.ptr(BUFS, 16), head.as_mut_ptr(), 16) };
    assert_eq!(head, [0xaa; 16], "nothing written into the read-only grant");
    let msgs = h.backend_msgs_within(EVENT);
    // A grant reaches the worker without a wait: a look just before it is a miss, asked for.
    let (last, before) = msgs.split_last().expect("a message");
    assert_eq!(
        *last,
        (IOTLB_ACCESS_FAIL, iova, 2),
        "ACCESS_FAIL for the write: {msgs:?}"
    );
    assert!(
        before.iter().all(|&m| m == (IOTLB_MISS, iova, 2)),
        "{msgs:?}"
    );
    assert!(b.alive(), "backend died\n{}", b.stderr());
    drop(h);
    let fin = stop_backend(&mut b);
    assert_eq!(u(&port(&fin, 0), "/queue_errors"), 1, "{fin}");
}
