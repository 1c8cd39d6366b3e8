//! A hostile vhost-user *device* against pvnet's own frontend ([`NetClient`]).
//!
//! The device is untrusted (issue 16, item 4). The backend here is not pvnet's: it is a
//! minimal vhost-user backend written in this file, on the `vhost` crate's
//! [`VhostUserBackendReqHandlerMut`]. It accepts a real `NetClient` connection, maps the memfd
//! the frontend shares in `SET_MEM_TABLE`, turns the ring addresses of `SET_VRING_ADDR` (the
//! frontend's user addresses) into offsets in that memfd, and then, driven step by step from
//! the test thread, writes used entries into the frontend's rings: first a correct one (so
//! every test can fail), then a malformed one.
//!
//! What each test checks, for the split ring and the packed ring:
//! * a used id the frontend never posted (past the ring, or in range but not in flight or
//!   already returned), on the receive and the transmit queue;
//! * a used length past the receive buffer;
//! * a used index that jumps past what is in flight (split only: the packed ring has no used
//!   index, and the frontend never looks past the buffers it has in flight);
//! * a device that keeps writing a receive buffer after completing it;
//! * a device that overwrites the descriptors the frontend posted (which it never reads back).
//!
//! A violation must come back as [`Error::Queue`] carrying the [`virtq::Error`], stop that
//! queue for good (every later call on it returns the same error, nothing more is posted to
//! it, even if the device "repairs" the ring), leave the other queue working, and never panic
//! or read outside the frontend's own buffers.
//!
//! Every test runs under a watchdog ([`bounded`]) and is deterministic in what it asserts.

use pvnet_vhost::features::{
    VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_EVENT_IDX, VIRTIO_F_RING_PACKED, VIRTIO_F_VERSION_1,
    VIRTIO_NET_F_MRG_RXBUF,
};
use pvnet_vhost::frontend::{ClientConfig, Error, NetClient, RxBuffers, RxFrame};
use pvnet_vhost::Mapping;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserShMemConfig, VhostUserSharedMsg,
    VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    BackendReqHandler, Error as VuError, GpuBackend, Result as VuResult,
    VhostUserBackendReqHandlerMut, VhostUserProtocolFeatures,
};

/// Descriptors per queue.
const QSZ: u16 = 16;
/// Bytes per frontend buffer, header included.
const BUF: u32 = 2048;
/// The virtio-net header with `VIRTIO_NET_F_MRG_RXBUF` (its last two bytes: `num_buffers`).
const HDR: usize = 12;
const RX: usize = 0;
const TX: usize = 1;
/// No test may take longer than this.
const LIMIT: Duration = Duration::from_secs(60);
/// What the hostile device offers.
const OFFER: u64 = VIRTIO_F_VERSION_1
    | VIRTIO_NET_F_MRG_RXBUF
    | VIRTIO_F_EVENT_IDX
    | VHOST_USER_F_PROTOCOL_FEATURES
    | VIRTIO_F_RING_PACKED;
/// Packed-ring descriptor flags (virtio 1.x 2.8).
const PACKED_F_AVAIL: u16 = 1 << 7;
const PACKED_F_USED: u16 = 1 << 15;

/// Runs `body` on its own thread and fails the test if it does not finish within [`LIMIT`].
fn bounded(body: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let h = thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match finished.recv_timeout(LIMIT) {
        Ok(()) => h.join().expect("test thread"),
        // The body panicked (its sender dropped): fail with its message.
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the body finished without reporting"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test did not finish within {LIMIT:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The frontend's memory, as the device sees it.

/// The frontend's memfd, mapped by the hostile device.
struct Mem {
    map: Mapping,
    /// Guest address of the memfd's first byte.
    gpa: u64,
    len: u64,
}

impl Mem {
    fn ptr(&self, off: u64, n: usize, align: u64) -> *mut u8 {
        assert!(
            off.checked_add(n as u64).is_some_and(|end| end <= self.len),
            "device access {off:#x}+{n} outside the shared memory"
        );
        assert!(
            off.is_multiple_of(align),
            "misaligned device access {off:#x}"
        );
        let off = usize::try_from(off).expect("offset fits usize");
        // SAFETY: off + n <= len (checked above): inside the live mapping.
        unsafe { self.map.start().as_ptr().add(off) }
    }

    fn a16(&self, off: u64) -> &AtomicU16 {
        let p = self.ptr(off, 2, 2);
        // SAFETY: two bytes inside the mapping (checked in `ptr`), 2-aligned (the mapping is
        // page aligned and `off` is checked); the mapping lives as long as `self`.
        unsafe { &*p.cast::<AtomicU16>() }
    }

    fn a32(&self, off: u64) -> &AtomicU32 {
        let p = self.ptr(off, 4, 4);
        // SAFETY: as in `a16`, four bytes, 4-aligned.
        unsafe { &*p.cast::<AtomicU32>() }
    }

    fn a64(&self, off: u64) -> &AtomicU64 {
        let p = self.ptr(off, 8, 8);
        // SAFETY: as in `a16`, eight bytes, 8-aligned.
        unsafe { &*p.cast::<AtomicU64>() }
    }

    fn bytes(&self, off: u64, n: usize) -> &[AtomicU8] {
        let p = self.ptr(off, n, 1);
        // SAFETY: n bytes inside the mapping (checked in `ptr`); AtomicU8 has the layout of u8;
        // the mapping lives as long as `self`.
        unsafe { std::slice::from_raw_parts(p.cast::<AtomicU8>(), n) }
    }

    fn write(&self, off: u64, src: &[u8]) {
        for (a, &b) in self.bytes(off, src.len()).iter().zip(src) {
            a.store(b, Ordering::Relaxed);
        }
    }

    fn read(&self, off: u64, n: usize) -> Vec<u8> {
        self.bytes(off, n)
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    }

    /// The memfd offset of guest range `gpa..gpa+len` (asserted inside the memory).
    fn off_of(&self, gpa: u64, len: u32) -> u64 {
        let off = gpa.checked_sub(self.gpa).expect("buffer below the region");
        assert!(off + u64::from(len) <= self.len, "buffer past the region");
        off
    }
}

/// One ring as the device drives it (offsets into the memfd).
#[derive(Debug, Default)]
struct Ring {
    desc: u64,
    avail: u64,
    used: u64,
    size: u16,
    /// Buffers posted and not yet returned, in posting order.
    posted: VecDeque<u16>,
    /// Guest address and length of the buffer last posted under each id.
    bufs: Vec<(u64, u32)>,
    /// Split: next avail index to read, next used index to write.
    last_avail: u16,
    used_idx: u16,
    /// Packed: next slot to read / to mark used, with their wrap counters.
    next_avail: u16,
    avail_wrap: bool,
    next_used: u16,
    used_wrap: bool,
}

/// The hostile device: the frontend's memory, its rings, its call fds.
struct Device {
    mem: Arc<Mem>,
    packed: bool,
    q: [Ring; 2],
    call: [File; 2],
}

impl Device {
    /// Reads what the frontend posted since the last look.
    fn take_avail(&mut self, q: usize) {
        let m = self.mem.clone();
        let r = &mut self.q[q];
        if self.packed {
            loop {
                let at = r.desc + 16 * u64::from(r.next_avail);
                let flags = m.a16(at + 14).load(Ordering::Acquire);
                let avail = flags & PACKED_F_AVAIL != 0;
                let used = flags & PACKED_F_USED != 0;
                if avail != r.avail_wrap || used == r.avail_wrap {
                    break;
                }
                let (addr, len) = (
                    m.a64(at).load(Ordering::Relaxed),
                    m.a32(at + 8).load(Ordering::Relaxed),
                );
                let id = m.a16(at + 12).load(Ordering::Relaxed);
                assert!(id < r.size, "the frontend posted id {id}");
                r.bufs[usize::from(id)] = (addr, len);
                r.posted.push_back(id);
                r.next_avail += 1;
                if r.next_avail == r.size {
                    r.next_avail = 0;
                    r.avail_wrap = !r.avail_wrap;
                }
            }
        } else {
            let idx = m.a16(r.avail + 2).load(Ordering::Acquire);
            while r.last_avail != idx {
                let slot = u64::from(r.last_avail & (r.size - 1));
                let head = m.a16(r.avail + 4 + 2 * slot).load(Ordering::Relaxed);
                assert!(head < r.size, "the frontend posted head {head}");
                let d = r.desc + 16 * u64::from(head);
                r.bufs[usize::from(head)] = (
                    m.a64(d).load(Ordering::Relaxed),
                    m.a32(d + 8).load(Ordering::Relaxed),
                );
                r.posted.push_back(head);
                r.last_avail = r.last_avail.wrapping_add(1);
            }
        }
    }

    /// The frontend's avail index (split) or next slot it will fill (packed), as a witness
    /// that it posted nothing new.
    fn avail_mark(&self, q: usize) -> (u16, u16) {
        let r = &self.q[q];
        if self.packed {
            let slot = r.next_avail;
            (
                slot,
                self.mem
                    .a16(r.desc + 16 * u64::from(slot) + 14)
                    .load(Ordering::Acquire),
            )
        } else {
            (self.mem.a16(r.avail + 2).load(Ordering::Acquire), 0)
        }
    }

    /// The oldest buffer posted and not yet used.
    fn next_posted(&mut self, q: usize) -> u16 {
        self.take_avail(q);
        self.q[q]
            .posted
            .pop_front()
            .expect("the frontend posted a buffer")
    }

    /// Memfd offset and length of buffer `id` as last posted.
    fn buf(&self, q: usize, id: u16) -> (u64, u32) {
        let (addr, len) = self.q[q].bufs[usize::from(id)];
        (self.mem.off_of(addr, len), len)
    }

    /// Writes used entries (whatever their ids and lengths) and publishes them at once.
    fn push_used(&mut self, q: usize, entries: &[(u32, u32)]) {
        let m = &self.mem;
        let r = &mut self.q[q];
        if self.packed {
            for &(id, len) in entries {
                let at = r.desc + 16 * u64::from(r.next_used);
                m.a32(at + 8).store(len, Ordering::Relaxed);
                #[allow(clippy::cast_possible_truncation)] // packed ids are 16 bits
                m.a16(at + 12).store(id as u16, Ordering::Relaxed);
                let bits = if r.used_wrap {
                    PACKED_F_AVAIL | PACKED_F_USED
                } else {
                    0
                };
                // Release: id and len are visible before the descriptor is marked used.
                m.a16(at + 14).store(bits, Ordering::Release);
                r.next_used += 1;
                if r.next_used == r.size {
                    r.next_used = 0;
                    r.used_wrap = !r.used_wrap;
                }
            }
        } else {
            for &(id, len) in entries {
                let slot = u64::from(r.used_idx & (r.size - 1));
                m.a32(r.used + 4 + 8 * slot).store(id, Ordering::Relaxed);
                m.a32(r.used + 8 + 8 * slot).store(len, Ordering::Relaxed);
                r.used_idx = r.used_idx.wrapping_add(1);
            }
            // Release: the entries are visible before the index that publishes them.
            m.a16(r.used + 2).store(r.used_idx, Ordering::Release);
        }
    }

    /// Split only: overwrites the used entry at `idx` (already published or not).
    fn rewrite_used(&self, q: usize, idx: u16, id: u32, len: u32) {
        let r = &self.q[q];
        let slot = u64::from(idx & (r.size - 1));
        self.mem
            .a32(r.used + 4 + 8 * slot)
            .store(id, Ordering::Relaxed);
        self.mem
            .a32(r.used + 8 + 8 * slot)
            .store(len, Ordering::Relaxed);
    }

    /// Split only: stores `used->idx`.
    fn set_used_idx(&mut self, q: usize, idx: u16) {
        self.mem
            .a16(self.q[q].used + 2)
            .store(idx, Ordering::Release);
        self.q[q].used_idx = idx;
    }

    /// Signals the queue's call eventfd.
    fn call(&self, q: usize) {
        (&self.call[q])
            .write_all(&1u64.to_ne_bytes())
            .expect("write call eventfd");
    }

    /// Writes a received frame, `hdr` (its `num_buffers` set here) then `payload`, across as
    /// many of the oldest posted RX buffers as it takes, and returns them used at once, each
    /// filled to its length. Returns the buffers' ids.
    fn rx_merged(&mut self, hdr: [u8; HDR], payload: &[u8]) -> Vec<u16> {
        let mut bytes = hdr.to_vec();
        bytes.extend_from_slice(payload);
        let mut ids = Vec::new();
        let mut used = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let id = self.next_posted(RX);
            let (off, cap) = self.buf(RX, id);
            let n = (bytes.len() - at).min(cap as usize);
            self.mem.write(off, &bytes[at..at + n]);
            at += n;
            ids.push(id);
            used.push((u32::from(id), u32::try_from(n).expect("buffer length")));
        }
        let nb = u16::try_from(ids.len()).expect("buffers");
        let (first, _) = self.buf(RX, ids[0]);
        self.mem.write(first + 10, &nb.to_le_bytes());
        self.push_used(RX, &used);
        self.call(RX);
        ids
    }

    /// Writes a received frame (header with `num_buffers` 1, then `payload`) into the oldest
    /// posted RX buffer and returns it used. Returns the buffer id.
    fn rx_frame(&mut self, payload: &[u8]) -> u16 {
        let id = self.next_posted(RX);
        let (off, cap) = self.buf(RX, id);
        assert!(HDR + payload.len() <= cap as usize);
        let mut hdr = [0u8; HDR];
        hdr[10..].copy_from_slice(&1u16.to_le_bytes());
        self.mem.write(off, &hdr);
        self.mem.write(off + HDR as u64, payload);
        let len = u32::try_from(HDR + payload.len()).expect("frame fits");
        self.push_used(RX, &[(u32::from(id), len)]);
        self.call(RX);
        id
    }
}

// ---------------------------------------------------------------------------------------------
// The hostile backend's control plane: just enough vhost-user to be connected to.

#[derive(Debug, Default)]
struct Vring {
    num: u16,
    /// (desc, used, avail) in the frontend's user addresses.
    addrs: Option<(u64, u64, u64)>,
    call: Option<File>,
    enabled: bool,
}

struct Region {
    gpa: u64,
    len: u64,
    uaddr: u64,
    offset: u64,
    file: File,
}

/// The vhost-user handler: records the frontend's setup and hands the device to the test
/// once both queues are enabled (the frontend's last setup message).
struct Control {
    acked: u64,
    region: Option<Region>,
    vrings: [Vring; 2],
    ready: Option<mpsc::Sender<Device>>,
}

fn bad(what: &'static str) -> VuError {
    VuError::InvalidOperation(what)
}

impl Control {
    fn vring(&mut self, index: u32) -> VuResult<&mut Vring> {
        self.vrings
            .get_mut(usize::try_from(index).map_err(|_| bad("queue index"))?)
            .ok_or(bad("queue index"))
    }

    fn device(&mut self) -> VuResult<Device> {
        let r = self.region.take().ok_or(bad("no memory table"))?;
        let map = Mapping::new(r.file, r.offset, r.len).map_err(VuError::ReqHandlerError)?;
        let mem = Arc::new(Mem {
            map,
            gpa: r.gpa,
            len: r.len,
        });
        let mut q: [Ring; 2] = Default::default();
        let mut call = Vec::new();
        for (ring, v) in q.iter_mut().zip(&mut self.vrings) {
            let (desc, used, avail) = v.addrs.ok_or(bad("no ring addresses"))?;
            let off = |u: u64| {
                u.checked_sub(r.uaddr)
                    .filter(|&o| o < r.len)
                    .ok_or(bad("ring outside memory"))
            };
            *ring = Ring {
                desc: off(desc)?,
                avail: off(avail)?,
                used: off(used)?,
                size: v.num,
                bufs: vec![(0, 0); usize::from(v.num)],
                avail_wrap: true,
                used_wrap: true,
                ..Ring::default()
            };
            call.push(v.call.take().ok_or(bad("no call fd"))?);
        }
        let call: [File; 2] = call.try_into().map_err(|_| bad("call fds"))?;
        Ok(Device {
            mem,
            packed: self.acked & VIRTIO_F_RING_PACKED != 0,
            q,
            call,
        })
    }
}

impl VhostUserBackendReqHandlerMut for Control {
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }
    fn reset_owner(&mut self) -> VuResult<()> {
        Ok(())
    }
    fn reset_device(&mut self) -> VuResult<()> {
        Ok(())
    }
    fn get_features(&mut self) -> VuResult<u64> {
        Ok(OFFER)
    }
    fn set_features(&mut self, features: u64) -> VuResult<()> {
        self.acked = features;
        Ok(())
    }
    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<Vec<u64>>> {
        let (r, file) = ctx
            .iter()
            .zip(files)
            .next()
            .ok_or(bad("empty memory table"))?;
        self.region = Some(Region {
            gpa: r.guest_phys_addr,
            len: r.memory_size,
            uaddr: r.user_addr,
            offset: r.mmap_offset,
            file,
        });
        Ok(None)
    }
    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        self.vring(index)?.num = u16::try_from(num).map_err(|_| bad("queue size"))?;
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
        self.vring(index)?.addrs = Some((descriptor, used, available));
        Ok(())
    }
    fn set_vring_base(&mut self, _index: u32, _base: u32) -> VuResult<()> {
        Ok(())
    }
    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        Ok(VhostUserVringState::new(index, 0))
    }
    fn set_vring_kick(&mut self, index: u8, _fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?;
        Ok(())
    }
    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?.call = fd;
        Ok(())
    }
    fn set_vring_err(&mut self, _index: u8, _fd: Option<File>) -> VuResult<()> {
        Ok(())
    }
    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ)
    }
    fn set_protocol_features(&mut self, _features: u64) -> VuResult<()> {
        Ok(())
    }
    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(1)
    }
    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        self.vring(index)?.enabled = enable;
        if self.vrings.iter().all(|v| v.enabled) {
            if let Some(ready) = self.ready.take() {
                let dev = self.device()?;
                let _ = ready.send(dev);
            }
        }
        Ok(())
    }
    fn get_config(&mut self, _o: u32, _s: u32, _f: VhostUserConfigFlags) -> VuResult<Vec<u8>> {
        Err(bad("GET_CONFIG"))
    }
    fn set_config(&mut self, _o: u32, _b: &[u8], _f: VhostUserConfigFlags) -> VuResult<()> {
        Err(bad("SET_CONFIG"))
    }
    fn set_gpu_socket(&mut self, _g: GpuBackend) -> VuResult<()> {
        Err(bad("GPU"))
    }
    fn get_shared_object(&mut self, _u: VhostUserSharedMsg) -> VuResult<File> {
        Err(bad("shared objects"))
    }
    fn get_inflight_fd(&mut self, _i: &VhostUserInflight) -> VuResult<(VhostUserInflight, File)> {
        Err(bad("inflight"))
    }
    fn set_inflight_fd(&mut self, _i: &VhostUserInflight, _f: File) -> VuResult<()> {
        Err(bad("inflight"))
    }
    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        Ok(1)
    }
    fn add_mem_region(
        &mut self,
        _r: &VhostUserSingleMemoryRegion,
        _f: File,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<u64>> {
        Err(bad("ADD_MEM_REGION"))
    }
    fn remove_mem_region(&mut self, _r: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        Err(bad("REM_MEM_REGION"))
    }
    fn set_device_state_fd(
        &mut self,
        _d: VhostTransferStateDirection,
        _p: VhostTransferStatePhase,
        _f: File,
    ) -> VuResult<Option<File>> {
        Err(bad("device state"))
    }
    fn check_device_state(&mut self) -> VuResult<()> {
        Err(bad("device state"))
    }
    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        Err(bad("shmem"))
    }
    fn set_log_base(&mut self, _l: &VhostUserLog, _f: File) -> VuResult<()> {
        Err(bad("log"))
    }
}

/// A connected `NetClient` and the hostile device behind it.
struct Rig {
    client: NetClient,
    dev: Device,
}

impl Rig {
    fn new(packed: bool) -> Self {
        Self::with(packed, RxBuffers::Fixed(BUF))
    }

    fn with(packed: bool, rx_buffers: RxBuffers) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path: PathBuf =
            std::env::temp_dir().join(format!("pvnet-hostile-dev-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind the hostile backend's socket");
        let (ready, device) = mpsc::channel();
        // The backend thread ends when the frontend disconnects (the client drops).
        thread::spawn(move || {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            let control = Control {
                acked: 0,
                region: None,
                vrings: Default::default(),
                ready: Some(ready),
            };
            let mut h = BackendReqHandler::from_stream(stream, Arc::new(Mutex::new(control)));
            while h.handle_request().is_ok() {}
        });
        let cfg = ClientConfig {
            queue_size: QSZ,
            buf_size: BUF,
            rx_buffers,
            packed,
            ..ClientConfig::default()
        };
        let client = NetClient::connect(&path, cfg).expect("connect to the hostile backend");
        let _ = std::fs::remove_file(&path);
        let dev = device
            .recv_timeout(Duration::from_secs(10))
            .expect("the backend saw both queues enabled");
        assert_eq!(dev.packed, packed, "ring format negotiated");
        let mut rig = Self { client, dev };
        rig.dev.take_avail(RX);
        assert_eq!(
            rig.dev.q[RX].posted.len(),
            usize::from(QSZ),
            "every RX buffer posted"
        );
        rig
    }

    /// Receives everything waiting, copying each frame out.
    fn recv(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        let mut out = Vec::new();
        self.client.recv_burst(usize::MAX, |f: &RxFrame<'_>| {
            let mut v = vec![0u8; f.len()];
            assert_eq!(f.read(0, &mut v), f.len());
            out.push(v);
        })?;
        Ok(out)
    }

    /// The valid first step on RX: a correct used entry delivers exactly its frame.
    fn rx_ok(&mut self, tag: u8) {
        let payload: Vec<u8> = (0..60u8).map(|i| i ^ tag).collect();
        self.dev.rx_frame(&payload);
        assert!(
            self.client.wait(Duration::from_secs(5)).expect("wait"),
            "call seen"
        );
        let before = self.client.stats.rx_packets;
        let frames = self.recv().expect("a valid used entry is accepted");
        assert_eq!(frames, vec![payload], "the frame the device wrote");
        assert_eq!(self.client.stats.rx_packets, before + 1);
    }

    /// Sends `n` frames and checks the device sees them; returns their buffer ids.
    fn tx_send(&mut self, n: usize) -> Vec<u16> {
        let mut scratch = vec![0u8; BUF as usize];
        let sent = self
            .client
            .send_burst(n, &mut scratch, |k, buf| {
                buf[..60].fill(0x40 + u8::try_from(k).expect("small burst"));
                60
            })
            .expect("send");
        assert_eq!(sent, n);
        (0..n)
            .map(|k| {
                let id = self.dev.next_posted(TX);
                let (off, len) = self.dev.buf(TX, id);
                assert_eq!(len as usize, HDR + 60);
                let bytes = self.dev.mem.read(off + HDR as u64, 60);
                assert!(
                    bytes.iter().all(|&b| usize::from(b) == 0x40 + k),
                    "frame {k}"
                );
                id
            })
            .collect()
    }

    /// The valid first step on TX: a frame goes out and its correct completion is reclaimed.
    fn tx_ok(&mut self) {
        let ids = self.tx_send(1);
        self.dev.push_used(TX, &[(u32::from(ids[0]), 0)]);
        assert_eq!(self.client.reclaim_tx().expect("a valid completion"), 1);
        assert_eq!(self.client.tx_in_flight(), 0);
    }
}

/// The `virtq::Error` inside a frontend result that must be a queue violation.
fn violation<T: std::fmt::Debug>(r: Result<T, Error>) -> virtq::Error {
    match r {
        Err(Error::Queue(e)) => e,
        other => panic!("expected a virtqueue violation, got {other:?}"),
    }
}

/// After `first` stopped the RX queue: it stays stopped with the same error, posts nothing,
/// and the TX queue still works.
fn assert_rx_stopped(rig: &mut Rig, first: virtq::Error) {
    assert_eq!(rig.client.rx_error(), Some(first));
    rig.dev.take_avail(RX);
    let mark = rig.dev.avail_mark(RX);
    assert_eq!(
        violation(rig.recv()),
        first,
        "a stopped queue stays stopped"
    );
    assert_eq!(violation(rig.client.refill_rx()), first);
    assert_eq!(violation(rig.client.arm_rx()), first);
    assert_eq!(
        rig.dev.avail_mark(RX),
        mark,
        "nothing posted to a stopped queue"
    );
    rig.tx_ok();
    assert_eq!(rig.client.rx_error(), Some(first));
}

/// After `first` stopped the TX queue: it stays stopped, takes nothing more, and RX still works.
fn assert_tx_stopped(rig: &mut Rig, first: virtq::Error) {
    assert_eq!(rig.client.tx_error(), Some(first));
    rig.dev.take_avail(TX);
    let mark = rig.dev.avail_mark(TX);
    assert_eq!(
        violation(rig.client.reclaim_tx()),
        first,
        "a stopped queue stays stopped"
    );
    let mut scratch = vec![0u8; BUF as usize];
    assert_eq!(
        violation(rig.client.send_burst(1, &mut scratch, |_, _| 60)),
        first
    );
    assert_eq!(violation(rig.client.arm_tx()), first);
    assert_eq!(
        rig.dev.avail_mark(TX),
        mark,
        "nothing posted to a stopped queue"
    );
    rig.rx_ok(0x33);
    assert_eq!(rig.client.tx_error(), Some(first));
}

// ---------------------------------------------------------------------------------------------
// The cases, each for both ring formats.

fn used_id_past_the_ring_on_rx(packed: bool) {
    // Packed ids are 16 bits on the wire: only the split ring can say more.
    let ids: &[u32] = if packed {
        &[16, 0x7fff, 0xffff]
    } else {
        &[16, 0xffff, 0x1_0000, u32::MAX]
    };
    for &bad in ids {
        let mut rig = Rig::new(packed);
        rig.rx_ok(1);
        rig.dev.take_avail(RX);
        rig.dev.push_used(RX, &[(bad, 64)]);
        rig.dev.call(RX);
        let e = violation(rig.recv());
        assert_eq!(e, virtq::Error::UsedIdInvalid { id: bad });
        // The device "repairs" the entry: the queue stays stopped all the same.
        if !packed {
            let id = rig.dev.q[RX].posted[0];
            let idx = rig.dev.q[RX].used_idx.wrapping_sub(1);
            rig.dev.rewrite_used(RX, idx, u32::from(id), 64);
        }
        assert_rx_stopped(&mut rig, e);
    }
}

fn used_id_returned_twice_on_rx(packed: bool) {
    let mut rig = Rig::new(packed);
    rig.rx_ok(2);
    // Buffer `id` is in flight once; the device returns it twice in one batch.
    let id = rig.dev.next_posted(RX);
    rig.dev
        .push_used(RX, &[(u32::from(id), 64), (u32::from(id), 64)]);
    rig.dev.call(RX);
    let e = violation(rig.recv());
    assert_eq!(e, virtq::Error::UsedIdInvalid { id: u32::from(id) });
    assert_rx_stopped(&mut rig, e);
}

fn used_id_past_the_ring_on_tx(packed: bool) {
    for bad in [u32::from(QSZ), 0xffff] {
        let mut rig = Rig::new(packed);
        rig.tx_ok();
        rig.tx_send(2);
        rig.dev.push_used(TX, &[(bad, 0)]);
        let e = violation(rig.client.reclaim_tx());
        assert_eq!(e, virtq::Error::UsedIdInvalid { id: bad });
        assert_eq!(rig.client.tx_in_flight(), 2, "nothing reclaimed");
        assert_tx_stopped(&mut rig, e);
    }
}

fn used_id_not_in_flight_on_tx(packed: bool) {
    // An id in range that was never posted: two frames in flight, the device names a third.
    let mut rig = Rig::new(packed);
    rig.tx_ok();
    let ids = rig.tx_send(2);
    let never = (0..QSZ).find(|i| !ids.contains(i)).expect("an idle id");
    rig.dev.push_used(TX, &[(u32::from(never), 0)]);
    let e = violation(rig.client.reclaim_tx());
    assert_eq!(
        e,
        virtq::Error::UsedIdInvalid {
            id: u32::from(never)
        }
    );
    assert_tx_stopped(&mut rig, e);

    // An id already returned: completed and reclaimed, then completed again.
    let mut rig = Rig::new(packed);
    let ids = rig.tx_send(2);
    rig.dev.push_used(TX, &[(u32::from(ids[0]), 0)]);
    assert_eq!(rig.client.reclaim_tx().expect("a valid completion"), 1);
    rig.dev.push_used(TX, &[(u32::from(ids[0]), 0)]);
    let e = violation(rig.client.reclaim_tx());
    assert_eq!(
        e,
        virtq::Error::UsedIdInvalid {
            id: u32::from(ids[0])
        }
    );
    assert_eq!(rig.client.tx_in_flight(), 1);
    assert_tx_stopped(&mut rig, e);
}

fn used_len_past_the_buffer_on_rx(packed: bool) {
    for bad in [BUF + 1, BUF + 4096, u32::MAX] {
        let mut rig = Rig::new(packed);
        rig.rx_ok(3);
        // The boundary is accepted: a frame filling the whole buffer.
        let id = rig.dev.next_posted(RX);
        let (off, _) = rig.dev.buf(RX, id);
        let mut full = vec![0x5au8; BUF as usize];
        full[..HDR].fill(0);
        full[10] = 1;
        rig.dev.mem.write(off, &full);
        rig.dev.push_used(RX, &[(u32::from(id), BUF)]);
        let frames = rig.recv().expect("len == buffer size is valid");
        assert_eq!(frames, vec![full[HDR..].to_vec()]);
        // One byte (or more) past it is not.
        let id = rig.dev.next_posted(RX);
        rig.dev.push_used(RX, &[(u32::from(id), bad)]);
        rig.dev.call(RX);
        let e = violation(rig.recv());
        assert_eq!(
            e,
            virtq::Error::UsedLenTooBig {
                id,
                len: bad,
                cap: BUF
            }
        );
        assert_rx_stopped(&mut rig, e);
    }
}

fn device_scribbling_a_completed_buffer(packed: bool) {
    let mut rig = Rig::new(packed);
    rig.rx_ok(4);
    rig.dev.take_avail(RX);
    // Buffers move through the receive pool as they are posted again: the scribbler hits
    // those posted now (refreshed every round below), where the device will write next.
    let posted = |rig: &Rig| -> Vec<(u64, u32)> {
        let ids = rig.dev.q[RX].posted.iter();
        ids.map(|&id| rig.dev.buf(RX, id)).collect()
    };
    let live = Arc::new(Mutex::new(posted(&rig)));
    let stop = Arc::new(AtomicBool::new(false));
    // Buffers scribbled over so far (the loop below runs until every buffer was hit often).
    let scribbled = Arc::new(AtomicU64::new(0));
    let scribbler = {
        let (mem, stop, scribbled) = (rig.dev.mem.clone(), stop.clone(), scribbled.clone());
        let live = live.clone();
        thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let pool = live.lock().expect("live buffers").clone();
                for &(off, len) in &pool {
                    // num_buffers (bytes 10-11) alternates between 1 (a frame) and 0xffff (a
                    // merged frame the device never published: malformed); the rest is noise.
                    let nb: u16 = if n.is_multiple_of(2) { 1 } else { 0xffff };
                    for (k, a) in mem.bytes(off, len as usize).iter().enumerate() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let b = match k {
                            10 | 11 => nb.to_le_bytes()[k - 10],
                            _ => x.to_le_bytes()[0],
                        };
                        a.store(b, Ordering::Relaxed);
                    }
                    n += 1;
                    scribbled.store(n, Ordering::Relaxed);
                }
            }
        })
    };
    // The guarantee: used id and len are read once and validated before any byte is read,
    // and the frame's bytes are copied out through `RxFrame::read`, bounded by those validated
    // lengths. A device racing on the buffer changes only the bytes of that frame (and, via
    // num_buffers, whether it is dropped as malformed); it cannot make the frontend read past
    // the frame, past the buffer, or hand out more than `len - header` bytes.
    const ROUNDS: u32 = 4000;
    const MAX_ROUNDS: u32 = 10_000_000;
    let len_of = |round: u32| (round % 4099 * 131) % (BUF + 1);
    let (mut delivered, mut short, errors_before) = (0u64, 0u64, rig.client.stats.rx_errors);
    let mut round = 0u32;
    while round < ROUNDS || scribbled.load(Ordering::Relaxed) < 8 * u64::from(QSZ) {
        assert!(round < MAX_ROUNDS, "the scribbler never ran");
        let id = rig.dev.next_posted(RX);
        // The buffer being completed and every other one posted.
        let mut now = posted(&rig);
        now.push(rig.dev.buf(RX, id));
        *live.lock().expect("live buffers") = now;
        let len = len_of(round);
        rig.dev.push_used(RX, &[(u32::from(id), len)]);
        let want = (len as usize).saturating_sub(HDR);
        short += u64::from((len as usize) < HDR);
        let mut seen = 0u64;
        rig.client
            .recv_burst(usize::MAX, |f| {
                seen += 1;
                assert_eq!(
                    f.len(),
                    want,
                    "frame length is the used length less the header"
                );
                let mut dst = vec![0xa5u8; BUF as usize + 64];
                assert_eq!(f.read(0, &mut dst), want);
                assert!(
                    dst[want..].iter().all(|&b| b == 0xa5),
                    "nothing past the frame"
                );
                assert_eq!(f.read(want, &mut dst), 0);
                let tail = want.saturating_sub(7);
                assert_eq!(f.read(tail, &mut dst[..3]), (want - tail).min(3));
            })
            .expect("a scribbled buffer is not a ring violation");
        assert!(seen <= 1);
        delivered += seen;
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    scribbler.join().expect("scribbler");
    let errors = rig.client.stats.rx_errors - errors_before;
    assert_eq!(
        delivered + errors,
        u64::from(round),
        "every used entry is delivered or counted as malformed"
    );
    // Lengths below the header are always malformed.
    assert!(errors >= short && short > 0);
    // Once the device behaves again, frames come through intact.
    rig.rx_ok(5);
    assert!(rig.client.rx_error().is_none());
}

fn device_rewriting_descriptors(packed: bool) {
    let mut rig = Rig::new(packed);
    rig.rx_ok(7);
    rig.tx_ok();
    let sent = rig.tx_send(2);
    rig.dev.take_avail(RX);
    // The device overwrites every descriptor of both rings (addresses pointing nowhere,
    // lengths of 4 GiB; split: flags and next too). The frontend keeps its own record of
    // what it posted and never reads a descriptor back.
    for q in [RX, TX] {
        for slot in 0..u64::from(QSZ) {
            let at = rig.dev.q[q].desc + 16 * slot;
            rig.dev
                .mem
                .a64(at)
                .store(0xdead_0000_0000 | slot, Ordering::Relaxed);
            rig.dev.mem.a32(at + 8).store(u32::MAX, Ordering::Relaxed);
            if !packed {
                rig.dev.mem.a32(at + 12).store(u32::MAX, Ordering::Relaxed);
            }
        }
    }
    let ids: Vec<(u32, u32)> = sent.iter().map(|&id| (u32::from(id), 0)).collect();
    rig.dev.push_used(TX, &ids);
    assert_eq!(rig.client.reclaim_tx().expect("valid completions"), 2);
    for tag in 8..8 + 2 * QSZ {
        rig.rx_ok(u8::try_from(tag).expect("small"));
        rig.tx_ok();
    }
    assert!(rig.client.rx_error().is_none() && rig.client.tx_error().is_none());
}

fn bursts_of_one(packed: bool) {
    let mut rig = Rig::new(packed);
    rig.rx_ok(9);
    // Three frames in one publish: a single-buffer one, one merged over two buffers, another
    // single one. `recv_burst(1, ..)` must hand them out one per call, in order, losing none.
    let ids: Vec<u16> = (0..4).map(|_| rig.dev.next_posted(RX)).collect();
    let mut used = Vec::new();
    let mut expect = Vec::new();
    for (k, (&id, nb)) in ids.iter().zip([1u16, 2, 0, 1]).enumerate() {
        let (off, _) = rig.dev.buf(RX, id);
        let body = vec![0x60 + u8::try_from(k).expect("small"); 100];
        let mut hdr = [0u8; HDR];
        hdr[10..].copy_from_slice(&nb.to_le_bytes());
        // The merged frame's second buffer carries no header: its bytes are all frame.
        if nb != 0 {
            rig.dev.mem.write(off, &hdr);
            rig.dev.mem.write(off + HDR as u64, &body);
            used.push((
                u32::from(id),
                u32::try_from(HDR + body.len()).expect("fits"),
            ));
            expect.push(body);
        } else {
            rig.dev.mem.write(off, &body);
            used.push((u32::from(id), 100));
            expect
                .last_mut()
                .expect("first buffer")
                .extend_from_slice(&body);
        }
    }
    rig.dev.push_used(RX, &used);
    for want in &expect {
        let mut got = Vec::new();
        let n = rig
            .client
            .recv_burst(1, |f| {
                let mut v = vec![0u8; f.len()];
                assert_eq!(f.read(0, &mut v), f.len());
                got.push(v);
            })
            .expect("valid frames");
        assert_eq!(n, 1);
        assert_eq!(got, std::slice::from_ref(want));
    }
    assert_eq!(rig.client.recv_burst(1, |_| {}).expect("empty"), 0);
    assert_eq!(rig.client.stats.rx_packets, 4);
    assert_eq!(rig.client.stats.rx_errors, 0);
}

// ---------------------------------------------------------------------------------------------
// Split ring.

#[test]
fn a_correct_device_delivers_frames_and_completes_sends() {
    bounded(|| {
        for packed in [false, true] {
            let mut rig = Rig::new(packed);
            for tag in 0..3 * QSZ {
                rig.rx_ok(u8::try_from(tag).expect("small"));
                rig.tx_ok();
            }
            assert_eq!(rig.client.stats.rx_packets, u64::from(3 * QSZ));
            assert_eq!(rig.client.stats.rx_errors, 0);
            assert!(rig.client.rx_error().is_none() && rig.client.tx_error().is_none());
        }
    });
}

#[test]
fn a_used_id_past_the_ring_stops_the_receive_queue() {
    bounded(|| used_id_past_the_ring_on_rx(false));
}

#[test]
fn a_used_id_returned_twice_stops_the_receive_queue() {
    bounded(|| used_id_returned_twice_on_rx(false));
}

#[test]
fn a_used_id_past_the_ring_stops_the_transmit_queue() {
    bounded(|| used_id_past_the_ring_on_tx(false));
}

#[test]
fn a_used_id_not_in_flight_stops_the_transmit_queue() {
    bounded(|| used_id_not_in_flight_on_tx(false));
}

#[test]
fn a_used_length_past_the_buffer_stops_the_receive_queue() {
    bounded(|| used_len_past_the_buffer_on_rx(false));
}

#[test]
fn a_used_index_jump_stops_the_receive_queue() {
    bounded(|| {
        for jump in [1000u16, QSZ + 1, 0xffff] {
            let mut rig = Rig::new(false);
            rig.rx_ok(6);
            let last = rig.dev.q[RX].used_idx;
            let idx = last.wrapping_add(jump);
            rig.dev.set_used_idx(RX, idx);
            rig.dev.call(RX);
            let e = violation(rig.recv());
            assert_eq!(
                e,
                virtq::Error::UsedIdxJump {
                    last,
                    idx,
                    in_flight: QSZ
                }
            );
            // Moving the index back does not restart the queue.
            rig.dev.set_used_idx(RX, last);
            assert_rx_stopped(&mut rig, e);
        }
    });
}

#[test]
fn a_used_index_jump_stops_the_transmit_queue() {
    bounded(|| {
        for jump in [1000u16, 3, 0xffff] {
            let mut rig = Rig::new(false);
            rig.tx_ok();
            rig.tx_send(2);
            let last = rig.dev.q[TX].used_idx;
            let idx = last.wrapping_add(jump);
            rig.dev.set_used_idx(TX, idx);
            let e = violation(rig.client.reclaim_tx());
            assert_eq!(
                e,
                virtq::Error::UsedIdxJump {
                    last,
                    idx,
                    in_flight: 2
                }
            );
            rig.dev.set_used_idx(TX, last);
            assert_tx_stopped(&mut rig, e);
        }
    });
}

#[test]
fn a_device_scribbling_a_completed_buffer_cannot_make_the_frontend_read_out_of_bounds() {
    bounded(|| device_scribbling_a_completed_buffer(false));
}

#[test]
fn a_device_rewriting_descriptors_cannot_redirect_the_frontend() {
    bounded(|| device_rewriting_descriptors(false));
}

// ---------------------------------------------------------------------------------------------
// Packed ring.

#[test]
fn a_used_id_past_the_ring_stops_the_packed_receive_queue() {
    bounded(|| used_id_past_the_ring_on_rx(true));
}

#[test]
fn a_used_id_returned_twice_stops_the_packed_receive_queue() {
    bounded(|| used_id_returned_twice_on_rx(true));
}

#[test]
fn a_used_id_past_the_ring_stops_the_packed_transmit_queue() {
    bounded(|| used_id_past_the_ring_on_tx(true));
}

#[test]
fn a_used_id_not_in_flight_stops_the_packed_transmit_queue() {
    bounded(|| used_id_not_in_flight_on_tx(true));
}

#[test]
fn a_used_length_past_the_buffer_stops_the_packed_receive_queue() {
    bounded(|| used_len_past_the_buffer_on_rx(true));
}

#[test]
fn a_device_scribbling_a_completed_packed_buffer_cannot_make_the_frontend_read_out_of_bounds() {
    bounded(|| device_scribbling_a_completed_buffer(true));
}

#[test]
fn a_device_rewriting_packed_descriptors_cannot_redirect_the_frontend() {
    bounded(|| device_rewriting_descriptors(true));
}

#[test]
fn a_burst_smaller_than_the_batch_leaves_the_other_frames_in_the_ring() {
    bounded(|| {
        bursts_of_one(false);
        bursts_of_one(true);
    });
}

/// A backend that accepts the connection and never answers: `connect` gives up after the
/// reply timeout with an error, instead of hanging.
#[test]
fn a_backend_that_never_answers_times_out() {
    let path: PathBuf =
        std::env::temp_dir().join(format!("pvnet-silent-dev-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).expect("bind");
    // Accepts, holds the connection open, reads nothing, says nothing.
    let silent = thread::spawn(move || listener.accept().map(|(s, _)| s));
    let cfg = ClientConfig {
        reply_timeout: Duration::from_millis(200),
        ..ClientConfig::default()
    };
    let t0 = std::time::Instant::now();
    let r = NetClient::connect(&path, cfg);
    let waited = t0.elapsed();
    let _ = std::fs::remove_file(&path);
    assert!(
        matches!(r, Err(Error::Vhost(_))),
        "connect to a silent backend: {:?}",
        r.map(|_| ())
    );
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "gave up after {waited:?}"
    );
    drop(silent.join());
}

// ---------------------------------------------------------------------------------------------
// Receiving in place, and receive buffers sized by an EWMA.

/// A frame's bytes, `len` of them, that differ from frame to frame.
fn pattern(len: usize, tag: u8) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i % 251).expect("small") ^ tag)
        .collect()
}

/// The device's view of the lengths the frontend offers in the buffers it posts now.
fn offered(rig: &mut Rig) -> Vec<u32> {
    rig.dev.take_avail(RX);
    let ids: Vec<u16> = rig.dev.q[RX].posted.iter().copied().collect();
    ids.iter().map(|&id| rig.dev.buf(RX, id).1).collect()
}

fn in_place_views(packed: bool) {
    let mut rig = Rig::with(packed, RxBuffers::Fixed(200));
    // A header with every field set, and frames of one buffer up to five (200-byte buffers,
    // 188 bytes of frame in the first).
    let mut hdr = [0u8; HDR];
    hdr[..10].copy_from_slice(&[1, 4, 54, 0, 0xb4, 5, 34, 0, 16, 0]);
    for (k, len) in [60usize, 188, 189, 700, 950].into_iter().enumerate() {
        let tag = u8::try_from(k).expect("small");
        let payload = pattern(len, tag);
        let ids = rig.dev.rx_merged(hdr, &payload);
        let mut seen = 0;
        rig.client
            .recv_burst(usize::MAX, |f| {
                seen += 1;
                assert_eq!((f.len(), f.buffers()), (len, ids.len()), "frame {k}");
                let h = f.hdr();
                assert_eq!(
                    (
                        h.flags,
                        h.gso_type,
                        h.hdr_len,
                        h.gso_size,
                        h.csum_start,
                        h.csum_offset
                    ),
                    (1, 4, 54, 1460, 34, 16)
                );
                assert_eq!(usize::from(h.num_buffers), ids.len());
                // The segments, in order, are the frame and nothing else.
                let mut got = Vec::new();
                for s in f.segments() {
                    let mut b = vec![0u8; s.len() as usize];
                    assert_eq!(s.read(0, &mut b), b.len());
                    got.extend_from_slice(&b);
                }
                assert_eq!(got, payload, "frame {k} in place");
                // Rewritten in place, the frame reads back changed; the headroom in front is
                // the caller's, and writing it leaves the frame as it is.
                let first = f.segments().next().expect("a segment");
                assert!(first.write_array(0, [0xee; 6]));
                let room = f.headroom();
                assert_eq!(room.len() as usize, 64 + HDR);
                assert_eq!(room.write(0, &[0x77; 64 + HDR]), 64 + HDR);
                let mut head = [0u8; 8];
                assert_eq!(f.read(0, &mut head), 8);
                assert_eq!(head[..6], [0xee; 6]);
                assert_eq!(head[6..], payload[6..8]);
                assert!(f.truesize() >= 200 * ids.len() as u64);
            })
            .expect("valid frames");
        assert_eq!(seen, 1);
        // Released: every buffer of the frame is posted again.
        let now = offered(&mut rig);
        assert_eq!(now.len(), usize::from(QSZ), "frame {k}: buffers back");
    }
    assert_eq!(rig.client.stats.rx_errors, 0);
}

#[test]
fn a_frame_received_in_place_reads_as_written_across_merged_buffers() {
    bounded(|| {
        in_place_views(false);
        in_place_views(true);
    });
}

#[test]
fn buffers_are_posted_again_only_after_the_frame_is_released() {
    bounded(|| {
        let mut rig = Rig::with(false, RxBuffers::Fixed(BUF));
        rig.dev.rx_frame(&pattern(100, 1));
        let before = rig.dev.avail_mark(RX);
        let mem = rig.dev.mem.clone();
        let avail = rig.dev.q[RX].avail;
        let mut during = None;
        rig.client
            .recv_burst(usize::MAX, |_| {
                // The device's side of the ring, read while the frame is held.
                during = Some(mem.a16(avail + 2).load(Ordering::Acquire));
            })
            .expect("a frame");
        assert_eq!(
            during,
            Some(before.0),
            "nothing posted while the frame was held"
        );
        assert_eq!(
            rig.dev.avail_mark(RX).0,
            before.0.wrapping_add(1),
            "posted after"
        );
    });
}

#[test]
fn ewma_buffers_follow_the_frame_lengths() {
    bounded(|| {
        let mut rig = Rig::with(false, RxBuffers::Ewma);
        // Seeded for a full Ethernet frame: 1514-byte frames take one buffer from the start.
        assert!(
            offered(&mut rig).iter().all(|&l| l >= 1526),
            "{:?}",
            offered(&mut rig)
        );
        let mut hdr = [0u8; HDR];
        hdr[10] = 1;
        let deliver = |rig: &mut Rig, len: usize, n: usize| -> (u64, u64) {
            let (p0, b0) = (rig.client.stats.rx_packets, rig.client.stats.rx_buffers);
            for k in 0..n {
                let tag = u8::try_from(k % 200).expect("small");
                rig.dev.rx_merged(hdr, &pattern(len, tag));
                let got = rig.recv().expect("valid frames");
                assert_eq!(got, vec![pattern(len, tag)]);
            }
            (
                rig.client.stats.rx_packets - p0,
                rig.client.stats.rx_buffers - b0,
            )
        };
        // 64-byte frames: the buffers shrink to the frame and its header, cache-line rounded.
        deliver(&mut rig, 64, 600);
        let small = offered(&mut rig);
        assert!(small.iter().rev().take(8).all(|&l| l <= 128), "{small:?}");
        // Larger frames are still received whole, across buffers, while the average grows.
        let (frames, bufs) = deliver(&mut rig, 1514, 50);
        assert!(bufs > frames, "merged while the buffers were small");
        deliver(&mut rig, 1514, 600);
        let (frames, bufs) = deliver(&mut rig, 1514, 50);
        assert_eq!(
            bufs, frames,
            "one buffer per 1514-byte frame once the average followed"
        );
        assert_eq!(rig.client.stats.rx_errors, 0);
    });
}

#[test]
fn a_used_length_past_an_ewma_buffer_stops_the_receive_queue() {
    bounded(|| {
        let mut rig = Rig::with(false, RxBuffers::Ewma);
        let id = rig.dev.next_posted(RX);
        let (_, cap) = rig.dev.buf(RX, id);
        rig.dev.push_used(RX, &[(u32::from(id), cap + 1)]);
        rig.dev.call(RX);
        let e = violation(rig.recv());
        assert_eq!(
            e,
            virtq::Error::UsedLenTooBig {
                id,
                len: cap + 1,
                cap
            }
        );
        assert_rx_stopped(&mut rig, e);
    });
}

#[test]
fn a_frame_announcing_more_buffers_than_the_device_returned_is_dropped_and_counted() {
    bounded(|| {
        let mut rig = Rig::with(false, RxBuffers::Fixed(200));
        // num_buffers says 3; the device returns 2 buffers, and nothing after them.
        let mut hdr = [0u8; HDR];
        hdr[10] = 1;
        let ids = rig.dev.rx_merged(hdr, &pattern(300, 9));
        assert_eq!(ids.len(), 2);
        let (first, _) = rig.dev.buf(RX, ids[0]);
        rig.dev.mem.write(first + 10, &3u16.to_le_bytes());
        let got = rig.recv().expect("not a ring violation");
        assert!(got.is_empty(), "no truncated frame delivered: {got:?}");
        assert_eq!(rig.client.stats.rx_errors, 2, "both buffers counted");
        assert!(rig.client.rx_error().is_none());
        // The queue goes on: the buffers came back, and the next frame is whole.
        assert_eq!(offered(&mut rig).len(), usize::from(QSZ));
        rig.dev.rx_merged(hdr, &pattern(300, 10));
        assert_eq!(rig.recv().expect("valid"), vec![pattern(300, 10)]);
    });
}
