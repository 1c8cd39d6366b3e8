//! `AF_XDP`: an interface's frames straight into pvnet's memory, past the kernel's socket
//! buffers (Linux `Documentation/networking/af_xdp.rst`), the way OVS (`type=afxdp`) and DPDK
//! (`net_af_xdp`) reach a NIC without a driver of their own.
//!
//! Per queue of the interface, one socket ([`Xsk`]) with its own UMEM (the packet memory,
//! [`RX_FRAMES`] frames for receiving and [`TX_FRAMES`] for transmitting, [`FRAME`] bytes
//! each) and its four rings ([`ring`]). The interface's XDP program ([`bpf`]) sends the
//! frames of queue `q` to socket `q` through an `XSKMAP`; frames for a queue without a socket
//! go on to the kernel's stack (`XDP_PASS`).
//!
//! Choices, and why:
//! * No libbpf, no clang, no crate for the sockets: the program is five instructions
//!   assembled in [`bpf`], the syscalls are `libc`'s (which has every `AF_XDP` struct), and
//!   the rings are pvnet's own, loaded once per batch as its virtqueues are. The README's two
//!   commands still set everything up on a fresh machine. `xsk-rs` needs libxdp and clang at
//!   build time; the pure-Rust `xdp` and `afxdp` crates bring their own ring code and
//!   allocation policy, which pvnet would have to wrap anyway.
//! * The program is attached through a BPF link: it leaves the interface when the port is
//!   dropped, or when the process dies, and an interface that has another program is
//!   refused, its program untouched.
//! * `XDP_USE_NEED_WAKEUP` always: the kernel is kicked (`sendto`, `recvfrom`) only when its
//!   ring's flag says it sleeps, so a busy port makes no syscall per packet.
//! * Aligned UMEM chunks of [`FRAME`] bytes, no headroom of pvnet's: the kernel puts a
//!   received frame behind its own 256-byte `XDP_PACKET_HEADROOM`, where the port writes the
//!   12-byte virtio-net header the rest of the dataplane expects in front of a packet.
//!
//! Where `AF_XDP` cannot run (no `AF_XDP` sockets, no `bpf()`, no permission, a driver without
//! native XDP when `mode=native`), [`XdpDev::open`] fails with an error that says what is
//! missing.

pub mod bpf;
mod btf;
pub mod ring;
mod umem;

use bpf::{Link, Prog, XskMap, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE};
use ring::Ring;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};
pub use umem::{data_addr, fill_addr, Umem, LEND_CHUNK, XDP_HEADROOM};

/// Bytes of one UMEM frame (a chunk): one page.
pub const FRAME: u32 = 4096;
/// Frames a socket receives into (all on the fill ring at the start).
pub const RX_FRAMES: u32 = 1024;
/// Frames a socket transmits from.
pub const TX_FRAMES: u32 = 1024;
/// Entries of each ring (fill, receive, transmit, completion).
const RING: u32 = 1024;
/// How long pvnet waits for the kernel to let go of what a closed port held before it calls
/// the queue or the interface taken (see [`while_busy`]); it takes milliseconds.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// `f`, again every 2 ms while it fails with one of `busy` (errno values), for at most
/// [`RELEASE_WAIT`]. What a port closed a moment ago held can still look taken: the kernel
/// lets go of a closed AF_XDP socket's queue from a work queue after the close returns, and a
/// process another thread is starting holds a copy of every descriptor (the XDP link's too)
/// until it execs. A port removed and added again, or a switch restarted, waits for that; what
/// another live socket or program holds is still refused, after the wait.
pub(super) fn while_busy<T>(busy: &[i32], mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        match f() {
            Err(e)
                if e.raw_os_error().is_some_and(|c| busy.contains(&c))
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            r => return r,
        }
    }
}

/// Which XDP mode to run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeReq {
    /// Native, else generic (said in the port's description).
    Auto,
    /// The driver's own XDP hook: frames reach the socket before any socket buffer exists.
    Native,
    /// Generic XDP (any driver): after the kernel has built the socket buffer.
    Generic,
}

impl std::str::FromStr for ModeReq {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "native" => Ok(Self::Native),
            "generic" => Ok(Self::Generic),
            o => Err(format!("unknown XDP mode {o:?} (auto, native, generic)")),
        }
    }
}

/// The mode the program runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `XDP_FLAGS_DRV_MODE`.
    Native,
    /// `XDP_FLAGS_SKB_MODE`.
    Generic,
}

impl Mode {
    /// "native" or "generic".
    pub fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Generic => "generic",
        }
    }
}

/// Whether the sockets use the driver's zero-copy support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroCopy {
    /// Zero-copy where the driver has it, else copy.
    Auto,
    /// Zero-copy or fail (`XDP_ZEROCOPY`).
    On,
    /// Copy mode (`XDP_COPY`).
    Off,
}

/// A setting that is `auto`, or forced `true` / `false` (`on` / `off`): None for auto; `key`
/// names it in the error.
fn auto_bool(key: &str, s: &str) -> Result<Option<bool>, String> {
    match s {
        "auto" => Ok(None),
        "true" | "on" => Ok(Some(true)),
        "false" | "off" => Ok(Some(false)),
        o => Err(format!("unknown {key} {o:?} (auto, true, false)")),
    }
}

impl std::str::FromStr for ZeroCopy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match auto_bool("zerocopy", s)? {
            None => Self::Auto,
            Some(true) => Self::On,
            Some(false) => Self::Off,
        })
    }
}

/// An `rx_hash` setting ([`XdpConfig::rx_hash`]): `auto` (None), `true` or `false`.
pub fn parse_rx_hash(s: &str) -> Result<Option<bool>, String> {
    auto_bool("rx_hash", s)
}

/// What to open.
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// The interface.
    pub ifname: String,
    /// Its queues to take (`0..queues`), one socket each.
    pub queues: u32,
    /// XDP mode.
    pub mode: ModeReq,
    /// Zero-copy.
    pub zerocopy: ZeroCopy,
    /// Ask the driver for each frame's RX hash (XDP metadata) where it can tell it (native
    /// mode, Linux 6.3, a driver with the kfunc). None (auto): where the interface has
    /// hardware behind it, whose RSS hash comes with the frame; not on a virtual device (a
    /// veth), whose driver would compute it in software, on the sending CPU, for every frame
    /// (measured on a veth: 0.88x the rate of a source-bound run), where pvnet hashes only
    /// what it steers.
    pub rx_hash: Option<bool>,
    /// Ask the driver for the VLAN tag carried beside each frame, not in its bytes (XDP
    /// metadata, native mode, Linux 6.8), and put it back in the frame. On by default: a
    /// bridge or a VLAN device sending through a veth, and a NIC with receive VLAN offload,
    /// carry tags that way, and without it they are lost.
    pub rx_vlan: bool,
    /// Receive straight into a vhost-user frontend's buffers where the switch sends every
    /// frame to one frontend (direct receive): the sockets' UMEM takes the frontend's memory
    /// behind pvnet's own frames (unaligned chunks of [`LEND_CHUNK`] bytes: a frame of up to
    /// 1792 bytes per descriptor), and the kernel's copy is the hop's only one.
    pub direct: bool,
}

impl XdpConfig {
    /// Queue 0 of `ifname`, with the defaults: mode and zero-copy `auto`, `rx_hash=auto`,
    /// `rx_vlan=true`.
    pub fn new(ifname: &str) -> Self {
        Self {
            ifname: ifname.to_string(),
            queues: 1,
            mode: ModeReq::Auto,
            zerocopy: ZeroCopy::Auto,
            rx_hash: None,
            rx_vlan: true,
            direct: false,
        }
    }
}

/// One bound `AF_XDP` socket: its rings and its UMEM. Field order is drop order: the socket
/// closes before its rings and memory are unmapped.
#[derive(Debug)]
pub struct Xsk {
    fd: OwnedFd,
    /// Fill ring: receive frames given to the kernel.
    pub fill: Ring<u64>,
    /// Completion ring: transmit frames the kernel is done with.
    pub comp: Ring<u64>,
    /// Receive ring.
    pub rx: Ring<libc::xdp_desc>,
    /// Transmit ring.
    pub tx: Ring<libc::xdp_desc>,
    /// The packet memory.
    pub umem: Umem,
    /// The interface queue it is bound to.
    pub queue: u32,
    /// Bound in zero-copy mode.
    pub zerocopy: bool,
    /// Bound with `XDP_USE_SG`: a packet may span several frames (multi-buffer).
    pub sg: bool,
    /// The interface and the bind flags asked for (`XDP_COPY` or `XDP_ZEROCOPY`), to bind
    /// again ([`XdpDev::rebuild`]).
    ifindex: u32,
    flags: u16,
}

fn err(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setopt<T>(fd: RawFd, opt: libc::c_int, val: &T, what: &str) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<T>()).unwrap_or(0);
    // SAFETY: `val` is a live `T` of `len` bytes for the call; the kernel only reads it.
    let r =
        unsafe { libc::setsockopt(fd, libc::SOL_XDP, opt, std::ptr::from_ref(val).cast(), len) };
    if r < 0 {
        return Err(err(io::Error::last_os_error(), what));
    }
    Ok(())
}

fn getopt<T: Copy>(fd: RawFd, opt: libc::c_int, val: &mut T, what: &str) -> io::Result<()> {
    let mut len = libc::socklen_t::try_from(size_of::<T>()).unwrap_or(0);
    // SAFETY: `val` is a live `T` of `len` bytes the kernel writes at most `len` of.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            std::ptr::from_mut(val).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(err(io::Error::last_os_error(), what));
    }
    Ok(())
}

impl Xsk {
    /// [`open`](Self::open) with `XDP_USE_SG` if `sg` (multi-buffer: a frame larger than a
    /// UMEM frame comes and goes as several descriptors, each but the last marked
    /// `XDP_PKT_CONTD`), falling back to one frame per packet where the driver or the mode
    /// has no multi-buffer (a fresh socket: a failed bind leaves one half set up).
    fn open_sg(
        ifindex: u32,
        queue: u32,
        flags: u16,
        sg: bool,
        umem: &dyn Fn() -> io::Result<Umem>,
    ) -> io::Result<Self> {
        if sg {
            match Self::open(ifindex, queue, flags | libc::XDP_USE_SG, umem()?) {
                Ok(mut x) => {
                    x.sg = true;
                    return Ok(x);
                }
                Err(e) => {
                    tracing::debug!(queue, "no AF_XDP multi-buffer ({e}): one frame a packet")
                }
            }
        }
        Self::open(ifindex, queue, flags, umem()?)
    }

    /// A socket on queue `queue` of interface `ifindex`, `umem` registered, its rings
    /// mapped, every receive frame on the fill ring, bound with `flags` (`XDP_COPY` or
    /// `XDP_ZEROCOPY`, with `XDP_USE_NEED_WAKEUP`).
    fn open(ifindex: u32, queue: u32, flags: u16, umem: Umem) -> io::Result<Self> {
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            let hint = match e.raw_os_error() {
                Some(libc::EAFNOSUPPORT) => {
                    " (this kernel has no AF_XDP sockets: CONFIG_XDP_SOCKETS)"
                }
                Some(libc::EPERM) => " (needs CAP_NET_RAW: run as root)",
                _ => "",
            };
            return Err(io::Error::new(
                e.kind(),
                format!("AF_XDP socket: {e}{hint}"),
            ));
        }
        // SAFETY: `raw` is a socket we just opened and own alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let s = fd.as_raw_fd();
        umem.register(s)?;
        let size: libc::c_int = libc::c_int::try_from(RING).unwrap_or(1024);
        setopt(s, libc::XDP_UMEM_FILL_RING, &size, "XDP_UMEM_FILL_RING")?;
        setopt(
            s,
            libc::XDP_UMEM_COMPLETION_RING,
            &size,
            "XDP_UMEM_COMPLETION_RING",
        )?;
        setopt(s, libc::XDP_RX_RING, &size, "XDP_RX_RING")?;
        setopt(s, libc::XDP_TX_RING, &size, "XDP_TX_RING")?;
        // SAFETY: all-zero is a valid `xdp_mmap_offsets` (plain integers).
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        getopt(s, libc::XDP_MMAP_OFFSETS, &mut off, "XDP_MMAP_OFFSETS")?;
        let pg = |o: u64| i64::try_from(o).unwrap_or(0);
        let fill = Ring::map(s, pg(libc::XDP_UMEM_PGOFF_FILL_RING), RING, &off.fr)
            .map_err(|e| err(e, "mmap fill ring"))?;
        let comp = Ring::map(s, pg(libc::XDP_UMEM_PGOFF_COMPLETION_RING), RING, &off.cr)
            .map_err(|e| err(e, "mmap completion ring"))?;
        let rx = Ring::map(s, libc::XDP_PGOFF_RX_RING, RING, &off.rx)
            .map_err(|e| err(e, "mmap rx ring"))?;
        let tx = Ring::map(s, libc::XDP_PGOFF_TX_RING, RING, &off.tx)
            .map_err(|e| err(e, "mmap tx ring"))?;
        let mut x = Self {
            fd,
            fill,
            comp,
            rx,
            tx,
            umem,
            queue,
            zerocopy: false,
            sg: false,
            ifindex,
            flags: flags & !libc::XDP_USE_SG,
        };
        if !x.umem.lends() {
            // A UMEM that lends has its fill ring kept by its port (loans first).
            let n = x.fill.free(RX_FRAMES).min(RX_FRAMES);
            for k in 0..n {
                x.fill.push(u64::from(k) * u64::from(FRAME));
            }
            x.fill.submit();
        }
        let sa = libc::sockaddr_xdp {
            sxdp_family: u16::try_from(libc::AF_XDP).unwrap_or(44),
            sxdp_flags: flags | libc::XDP_USE_NEED_WAKEUP,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_xdp>()).unwrap_or(0);
        // A bind that finds the queue taken (`EBUSY`) fails before it changes anything, so
        // binding again is sound.
        let bound = while_busy(&[libc::EBUSY], || {
            // SAFETY: `sa` is a valid `sockaddr_xdp` of `len` bytes for the call.
            let r = unsafe { libc::bind(s, std::ptr::from_ref(&sa).cast(), len) };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
        if let Err(e) = bound {
            let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                " (another AF_XDP socket holds this queue)"
            } else {
                ""
            };
            return Err(err(e, &format!("bind to queue {queue}{hint}")));
        }
        let mut o = libc::xdp_options { flags: 0 };
        getopt(s, libc::XDP_OPTIONS, &mut o, "XDP_OPTIONS")?;
        x.zerocopy = o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0;
        Ok(x)
    }

    /// Wakes the kernel to transmit what the transmit ring holds (`sendto`, non-blocking).
    /// `Ok(true)`: it has more to do (it sends at most a batch per call).
    pub fn kick_tx(&self) -> io::Result<bool> {
        // SAFETY: a zero-length send with no buffer and no address: only a wake-up.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r >= 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS) => Ok(true),
            _ => Err(e),
        }
    }

    /// Wakes the kernel to refill from the fill ring (`recvfrom`, non-blocking; a
    /// zero-copy driver asks for it when its fill ring ran dry).
    pub fn kick_rx(&self) -> io::Result<()> {
        // SAFETY: a zero-length receive with no buffer and no address: only a wake-up.
        let r = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS) => Ok(()),
            _ => Err(e),
        }
    }

    /// The kernel's drop counters for this socket (`XDP_STATISTICS`).
    pub fn kernel_stats(&self) -> io::Result<libc::xdp_statistics> {
        // SAFETY: all-zero is a valid `xdp_statistics` (plain integers).
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        getopt(
            self.fd.as_raw_fd(),
            libc::XDP_STATISTICS,
            &mut st,
            "XDP_STATISTICS",
        )?;
        Ok(st)
    }
}

impl AsRawFd for Xsk {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The interface's program, attached, and its socket map: shared by the lanes of a port
/// ([`XdpDev::into_lanes`]), the program leaving the interface with the last of them. Field
/// order is drop order: the link goes first (the program leaves the interface), then the
/// program and the map.
#[derive(Debug)]
struct Attached {
    _link: Link,
    _prog: Prog,
    map: XskMap,
    name: String,
    mode: Mode,
    meta: Meta,
}

/// What the program puts in front of each frame ([`bpf::META_LEN`] bytes) besides zeros.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meta {
    /// The VLAN tag taken out of the frame before XDP saw it.
    pub vlan: bool,
    /// The driver's RX hash.
    pub hash: bool,
}

/// An interface taken through `AF_XDP`: its program attached, a socket per queue (or, for
/// one lane of a port spread over workers, per queue of that lane). Field order is drop
/// order: the attachment goes first (the program leaves the interface if this was its last
/// holder), then the sockets.
#[derive(Debug)]
pub struct XdpDev {
    attached: std::sync::Arc<Attached>,
    /// Its sockets; the interface queue of each is its [`Xsk::queue`].
    pub queues: Vec<Xsk>,
    /// Most workers its queues may be spread over (0: as many as queues and workers allow).
    lanes: u32,
}

impl XdpDev {
    /// Takes `cfg.ifname` (which must exist; it is brought up): loads and attaches the
    /// program, opens and binds a socket per queue.
    pub fn open(cfg: &XdpConfig) -> io::Result<Self> {
        let name = cfg.ifname.as_str();
        let cname = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
        // SAFETY: `cname` is a valid NUL-terminated string for the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(err(
                io::Error::last_os_error(),
                &format!("interface {name}"),
            ));
        }
        if cfg.queues == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queues must be at least 1",
            ));
        }
        crate::sys::tap::set_link_up(name, None)?;
        let map = XskMap::new(cfg.queues)?;
        let (prog, link, mode, frags, meta) = attach(cfg, &map, ifindex)?;
        if mode == Mode::Generic && cfg.zerocopy == ZeroCopy::On {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{name}: zero-copy needs native XDP mode (runs in generic mode)"),
            ));
        }
        let lend = cfg.direct;
        // A frame spread over several lent buffers would not be one virtio packet: with
        // direct receive a frame is one descriptor (up to a chunk less the headroom).
        let frags = frags && !lend;
        let umem = move || {
            if lend {
                Umem::lending(RX_FRAMES + TX_FRAMES, &[])
            } else {
                Umem::new(RX_FRAMES + TX_FRAMES)
            }
        };
        let mut queues = Vec::new();
        for q in 0..cfg.queues {
            let x = match (mode, cfg.zerocopy) {
                (Mode::Native, ZeroCopy::On) => {
                    Xsk::open_sg(ifindex, q, libc::XDP_ZEROCOPY, frags, &umem).map_err(|e| {
                        err(
                            e,
                            &format!("{name}: zero-copy (the driver may not support it)"),
                        )
                    })?
                }
                (Mode::Native, ZeroCopy::Auto) => {
                    // A failed zero-copy bind leaves the socket half set up: a fresh one.
                    match Xsk::open_sg(ifindex, q, libc::XDP_ZEROCOPY, frags, &umem) {
                        Ok(x) => x,
                        Err(_) => Xsk::open_sg(ifindex, q, libc::XDP_COPY, frags, &umem)?,
                    }
                }
                _ => Xsk::open_sg(ifindex, q, libc::XDP_COPY, frags, &umem)?,
            };
            map.set(q, x.as_raw_fd())?;
            queues.push(x);
        }
        Ok(Self {
            attached: std::sync::Arc::new(Attached {
                _link: link,
                _prog: prog,
                map,
                name: name.to_string(),
                mode,
                meta,
            }),
            queues,
            lanes: 0,
        })
    }

    /// At most `n` lanes for this port's queues when it runs on several workers (0: as many
    /// as its queues and the workers allow; 1: every queue on one worker).
    #[must_use]
    pub fn with_lanes(mut self, n: u32) -> Self {
        self.lanes = n;
        self
    }

    /// How many lanes its queues make on `workers` workers: one per worker, at most one per
    /// queue, at most what [`Self::with_lanes`] allows.
    pub fn lanes_on(&self, workers: usize) -> usize {
        let cap = match self.lanes {
            0 => usize::MAX,
            n => n as usize,
        };
        self.queues.len().min(workers).min(cap).max(1)
    }

    /// Splits the sockets into `n` lanes, queue `q` (the `q`-th socket) to lane `q mod n`,
    /// each lane a device of its own that shares the program and map. The program leaves
    /// the interface when the last lane is dropped; until then, frames for the queues of a
    /// lane already dropped go on to the kernel's stack (`XDP_PASS`: the kernel takes a
    /// closed socket out of the map).
    pub fn into_lanes(self, n: usize) -> Vec<XdpDev> {
        let n = n.clamp(1, self.queues.len().max(1));
        let mut lanes: Vec<XdpDev> = (0..n)
            .map(|_| XdpDev {
                attached: self.attached.clone(),
                queues: Vec::new(),
                lanes: self.lanes,
            })
            .collect();
        for (q, x) in self.queues.into_iter().enumerate() {
            lanes[q % n].queues.push(x);
        }
        lanes
    }

    /// Replaces socket `i` by a fresh one on the same queue, bound as it was, whose UMEM has
    /// `views` (a frontend's memory as pvnet maps it) behind the own frames: what direct
    /// receive lends from. Its frames go to the kernel's stack from the moment the old
    /// socket leaves the map until the new one is in it. The old socket is closed before the
    /// new one binds (a queue takes one socket): when this returns, the kernel writes into
    /// nothing the old one's fill ring held. What was on the old rings is gone: the caller
    /// takes what it wants first. If the new socket cannot be had with the views, it is
    /// bound without them; if not at all, the error, and the device has one socket fewer.
    pub fn rebuild(&mut self, i: usize, views: &[pvnet_vhost::View]) -> io::Result<()> {
        let Some(old) = self.queues.get(i) else {
            return Err(io::ErrorKind::NotFound.into());
        };
        let (q, ifindex, flags, sg) = (old.queue, old.ifindex, old.flags, old.sg);
        self.attached.map.delete(q)?;
        drop(self.queues.remove(i));
        let x = Xsk::open_sg(ifindex, q, flags, sg, &|| {
            Umem::lending(RX_FRAMES + TX_FRAMES, views)
        })
        .or_else(|e| {
            tracing::warn!(
                ifname = self.name(),
                queue = q,
                "AF_XDP socket over the frontend's memory: {e}: without it (one copy)"
            );
            Xsk::open_sg(ifindex, q, flags, sg, &|| {
                Umem::lending(RX_FRAMES + TX_FRAMES, &[])
            })
        })?;
        self.attached.map.set(q, x.as_raw_fd())?;
        self.queues.insert(i, x);
        Ok(())
    }

    /// What the program puts in front of each frame ([`bpf::META_LEN`] bytes; all zero
    /// where it puts nothing).
    pub fn meta(&self) -> Meta {
        self.attached.meta
    }

    /// Whether the program puts each frame's RX hash in front of it (zero where the driver
    /// had none for that frame).
    pub fn rx_hash(&self) -> bool {
        self.attached.meta.hash
    }

    /// The interface.
    pub fn name(&self) -> &str {
        &self.attached.name
    }

    /// The XDP mode in use.
    pub fn mode(&self) -> Mode {
        self.attached.mode
    }

    /// Whether the sockets run zero-copy.
    pub fn zerocopy(&self) -> bool {
        self.queues.iter().all(|q| q.zerocopy)
    }

    /// Whether its sockets' UMEMs lend (direct receive: [`XdpConfig::direct`]).
    pub fn lends(&self) -> bool {
        self.queues.iter().all(|q| q.umem.lends())
    }

    /// Whether every socket takes multi-buffer packets (`XDP_USE_SG`): frames larger than a
    /// UMEM frame, as jumbo frames are.
    pub fn multi_buffer(&self) -> bool {
        self.queues.iter().all(|q| q.sg)
    }

    /// What it runs as, for `pvnet ctl ports`: "veth0, XDP native, copy, 1 queue".
    pub fn describe(&self) -> String {
        let n = self.queues.len();
        format!(
            "{}, XDP {}, {}{}{}{}{}, {n} queue{}",
            self.name(),
            self.mode().name(),
            if self.zerocopy() { "zero-copy" } else { "copy" },
            if self.lends() { ", direct" } else { "" },
            if self.multi_buffer() {
                ", multi-buffer"
            } else {
                ""
            },
            if self.meta().vlan { ", rx-vlan" } else { "" },
            if self.rx_hash() { ", rx-hash" } else { "" },
            if n == 1 { "" } else { "s" }
        )
    }
}

/// Loads the program and attaches it to `ifindex` in the mode `cfg` asks for: the form that
/// puts the frame's metadata in front of it where it loads and attaches natively (its VLAN
/// tag if `cfg.rx_vlan`; its RX hash if `cfg.rx_hash`, or by default where the interface has
/// hardware behind it), else the plain one. Returns the program, its link, the
/// mode, whether it takes multi-buffer frames, and the metadata it puts there.
fn attach(
    cfg: &XdpConfig,
    map: &XskMap,
    ifindex: u32,
) -> io::Result<(Prog, Link, Mode, bool, Meta)> {
    let name = cfg.ifname.as_str();
    let want_hash = cfg.rx_hash.unwrap_or_else(|| {
        let hw = crate::sys::tap::has_hardware(name);
        if !hw {
            tracing::info!(
                ifname = name,
                "rx_hash=auto: a virtual device (its driver would hash every frame in software): pvnet hashes what it steers"
            );
        }
        hw
    });
    if cfg.mode != ModeReq::Generic && (cfg.rx_vlan || want_hash) {
        let parts = (cfg.rx_vlan, want_hash);
        match with_frags(|frags| Prog::load_meta(map, frags, ifindex, parts)) {
            Ok(((p, (vlan, hash)), frags)) => {
                match Link::attach(&p, ifindex, name, XDP_FLAGS_DRV_MODE) {
                    Ok(l) => return Ok((p, l, Mode::Native, frags, Meta { vlan, hash })),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(e),
                    // No native XDP: the plain program decides below.
                    Err(_) => {}
                }
            }
            Err(e) => tracing::info!(
                ifname = name,
                "no XDP metadata ({e}): VLAN tags the kernel takes out of frames are lost, pvnet hashes flows"
            ),
        }
    }
    let (prog, frags) = with_frags(|frags| Prog::load(map, frags))?;
    let (link, mode) = match cfg.mode {
        ModeReq::Native => (
            Link::attach(&prog, ifindex, name, XDP_FLAGS_DRV_MODE)?,
            Mode::Native,
        ),
        ModeReq::Generic => (
            Link::attach(&prog, ifindex, name, XDP_FLAGS_SKB_MODE)?,
            Mode::Generic,
        ),
        ModeReq::Auto => match Link::attach(&prog, ifindex, name, XDP_FLAGS_DRV_MODE) {
            Ok(l) => (l, Mode::Native),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(e),
            Err(native) => match Link::attach(&prog, ifindex, name, XDP_FLAGS_SKB_MODE) {
                Ok(l) => {
                    tracing::info!(ifname = name, "no native XDP ({native}): generic mode");
                    (l, Mode::Generic)
                }
                Err(e) => return Err(io::Error::new(e.kind(), format!("{native}; {e}"))),
            },
        },
    };
    if mode == Mode::Generic && cfg.rx_vlan {
        tracing::info!(
            ifname = name,
            "generic XDP: a VLAN tag the kernel or the NIC takes out of a frame (receive VLAN offload) is lost; `ethtool -K {name} rxvlan off` keeps tags in the frames"
        );
    }
    Ok((prog, link, mode, frags, Meta::default()))
}

/// Loads a program with multi-buffer (`BPF_F_XDP_HAS_FRAGS`) where the kernel has it (5.18):
/// frames past one UMEM frame then arrive as several descriptors. A kernel without it refuses
/// the flag (EINVAL): loaded without, one frame each. Returns whether it has it.
fn with_frags<P>(load: impl Fn(bool) -> io::Result<P>) -> io::Result<(P, bool)> {
    match load(true) {
        Ok(p) => Ok((p, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((load(false)?, false)),
        Err(e) => Err(e),
    }
}
