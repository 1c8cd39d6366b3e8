//! The XDP program that sends an interface's frames to pvnet's `AF_XDP` sockets, made, loaded
//! and attached through the `bpf(2)` syscall alone (no libbpf, no clang: nothing to install).
//!
//! The program is five instructions, assembled here (what `clang -O2` makes of
//! `return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);`):
//!
//! ```text
//! r2 = *(u32 *)(r1 + 16)      ; ctx->rx_queue_index
//! r1 = map[xsks_map] ll       ; ld_imm64, src_reg BPF_PSEUDO_MAP_FD: the loader puts the map in
//! r3 = 2                      ; XDP_PASS: the action when the queue has no socket
//! call bpf_redirect_map       ; helper 51
//! exit
//! ```
//!
//! Where the driver can tell what it knows of a frame beside its bytes (XDP metadata kfuncs: a
//! veth, mlx5, ice, ...), a second form asks first and puts the answers in front of the frame
//! as metadata the `AF_XDP` socket receives with it ([`META_LEN`] bytes): the VLAN tag a NIC
//! or the kernel took out of the frame (`bpf_xdp_metadata_rx_vlan_tag`, Linux 6.8: its TPID
//! big-endian, then its TCI) and the RX hash and its type (`bpf_xdp_metadata_rx_hash`, 6.3),
//! each part only where asked for and the kernel has its kfunc:
//!
//! ```text
//! r6 = r1
//! r2 = -12; call bpf_xdp_adjust_meta          ; helper 54: 12 bytes of metadata
//! if r0 != 0 goto redirect
//! r2 = ctx->data; r7 = ctx->data_meta
//! r1 = r7 + 12; if r1 > r2 goto redirect      ; the verifier's bounds check
//! *(u32 *)(r7 + 0) = 0; ... (r7 + 8) = 0      ; nothing unless the driver tells
//! r1 = r6; r2 = r7; r3 = r7 + 2
//! call bpf_xdp_metadata_rx_vlan_tag           ; a kfunc, by its id in the kernel's BTF
//! r1 = r6; r2 = r7 + 4; r3 = r7 + 8
//! call bpf_xdp_metadata_rx_hash
//! redirect: (the five instructions above, ctx in r6)
//! ```
//!
//! A program that calls them must be bound to the device when loaded (`prog_ifindex`,
//! `BPF_F_XDP_DEV_BOUND_ONLY`): the kernel then calls the driver's own function in its place.
//! It attaches in native mode only.
//!
//! It is attached through a BPF link (`BPF_LINK_CREATE`, Linux 5.9+), never a netlink
//! attachment: the link belongs to the fd, so the program leaves the interface when the port
//! closes it, and also when pvnet dies. A link refuses an interface that already has a
//! program in that mode (`EBUSY`) or in the other one (`EEXIST`): pvnet leaves another
//! program alone and says so (after a short wait: a link a port closed a moment ago can still
//! be held by a process being started, see `while_busy`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
/// `prog_flags`: the XDP program takes multi-buffer frames (Linux 5.18).
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
/// `prog_flags`: bound to the device `prog_ifindex` names (its XDP metadata kfuncs), Linux 6.3.
const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;
/// `src_reg` of a call to a kernel function (`imm`: its BTF id).
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const BPF_FUNC_XDP_ADJUST_META: i32 = 54;
/// The kfunc that gives a frame's RX hash (`u32 *hash, enum xdp_rss_hash_type *type`).
pub const RX_HASH_KFUNC: &str = "bpf_xdp_metadata_rx_hash";
/// The kfunc that gives the VLAN tag taken out of a frame (`__be16 *tpid, u16 *tci`).
pub const RX_VLAN_KFUNC: &str = "bpf_xdp_metadata_rx_vlan_tag";
/// Bytes of metadata the metadata program puts in front of a frame: the VLAN tag's TPID
/// (big-endian, zero where the frame came with none out of its bytes) and TCI (native order),
/// the RX hash, its type.
pub const META_LEN: u32 = 12;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`'s `BPF_XDP`.
const BPF_XDP: u32 = 37;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;
/// `XDP_FLAGS_SKB_MODE`: generic XDP, run on the kernel's socket buffers (any driver).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: native XDP, run by the driver before any socket buffer exists.
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// Bytes of `union bpf_attr` this code fills (the kernel takes a shorter one, zeros past it).
const ATTR_LEN: usize = 128;
/// Offsets in `struct xdp_md`.
const XDP_MD_DATA: i16 = 0;
const XDP_MD_DATA_META: i16 = 8;
const XDP_MD_RX_QUEUE: i16 = 16;

/// One BPF instruction (`struct bpf_insn`): opcode, registers (dst low nibble, src high),
/// offset, immediate.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The program's instructions, with the map's fd in the `ld_imm64`; `ctx`: the register that
/// holds the context (r1 on entry, r6 after the hash part).
fn redirect(map_fd: i32, ctx: u8) -> [Insn; 6] {
    [
        // BPF_LDX | BPF_MEM | BPF_W: r2 = *(u32 *)(ctx + 16)
        insn(0x61, 2, ctx, XDP_MD_RX_QUEUE, 0),
        // BPF_LD | BPF_IMM | BPF_DW (two slots): r1 = the map
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        // BPF_ALU64 | BPF_MOV | BPF_K: r3 = XDP_PASS
        insn(0xb7, 3, 0, 0, XDP_PASS),
        // BPF_JMP | BPF_CALL
        insn(0x85, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        // BPF_JMP | BPF_EXIT
        insn(0x95, 0, 0, 0, 0),
    ]
}

/// The plain program.
fn program(map_fd: i32) -> Vec<Insn> {
    redirect(map_fd, 1).to_vec()
}

/// The program that first puts what the driver tells of the frame in front of it (the module
/// docs), calling the kfuncs by their BTF ids: `vlan` ([`RX_VLAN_KFUNC`]) and `hash`
/// ([`RX_HASH_KFUNC`]), each where given.
fn program_meta(map_fd: i32, vlan: Option<i32>, hash: Option<i32>) -> Vec<Insn> {
    let len = i32::try_from(META_LEN).unwrap_or(0);
    let mut p = vec![
        // BPF_ALU64 | BPF_MOV | BPF_X: r6 = r1
        insn(0xbf, 6, 1, 0, 0),
        insn(0xb7, 2, 0, 0, -len),
        insn(0x85, 0, 0, 0, BPF_FUNC_XDP_ADJUST_META),
        // BPF_JMP | BPF_JNE | BPF_K: if r0 != 0 goto redirect (offset set below)
        insn(0x55, 0, 0, 0, 0),
        insn(0x61, 2, 6, XDP_MD_DATA, 0),
        insn(0x61, 7, 6, XDP_MD_DATA_META, 0),
        insn(0xbf, 1, 7, 0, 0),
        // BPF_ALU64 | BPF_ADD | BPF_K: r1 += 12
        insn(0x07, 1, 0, 0, len),
        // BPF_JMP | BPF_JGT | BPF_X: if r1 > r2 goto redirect (offset set below)
        insn(0x2d, 1, 2, 0, 0),
        // BPF_ST | BPF_MEM | BPF_W: the metadata zeroed
        insn(0x62, 7, 0, 0, 0),
        insn(0x62, 7, 0, 4, 0),
        insn(0x62, 7, 0, 8, 0),
    ];
    // A kfunc call with r2 = r7 + `a`, r3 = r7 + `b`.
    let call = |p: &mut Vec<Insn>, id: i32, a: i32, b: i32| {
        p.push(insn(0xbf, 1, 6, 0, 0));
        for (r, off) in [(2, a), (3, b)] {
            p.push(insn(0xbf, r, 7, 0, 0));
            if off != 0 {
                p.push(insn(0x07, r, 0, 0, off));
            }
        }
        p.push(insn(0x85, 0, BPF_PSEUDO_KFUNC_CALL, 0, id));
    };
    if let Some(id) = vlan {
        call(&mut p, id, 0, 2);
    }
    if let Some(id) = hash {
        call(&mut p, id, 4, 8);
    }
    // Both jumps land on the redirect, right after the part.
    let end = i16::try_from(p.len()).unwrap_or(0);
    p[3].off = end - 4;
    p[8].off = end - 9;
    p.extend_from_slice(&redirect(map_fd, 6));
    p
}

/// A zeroed `union bpf_attr` with little-endian fields put at their offsets.
struct Attr([u64; ATTR_LEN / 8]);

impl Attr {
    fn new() -> Self {
        Self([0; ATTR_LEN / 8])
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the array is ATTR_LEN bytes of plain integers; any byte pattern is valid.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), ATTR_LEN) }
    }
    fn u32(mut self, off: usize, v: u32) -> Self {
        self.bytes()[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, off: usize, v: u64) -> Self {
        self.bytes()[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

/// `bpf(cmd, attr)`: the fd or value it returns.
fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<i32> {
    // SAFETY: `attr` is ATTR_LEN bytes, live for the call; every pointer it carries points at
    // memory the caller keeps alive across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            libc::c_uint::try_from(ATTR_LEN).unwrap_or(0),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i32::try_from(r).unwrap_or(-1))
}

/// Names what is missing when `bpf(2)` fails for want of the kernel or permission.
fn missing(e: io::Error, what: &str) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::ENOSYS) => " (the kernel has no bpf() syscall: CONFIG_BPF_SYSCALL)",
        Some(libc::EPERM) => " (needs CAP_BPF and CAP_NET_ADMIN: run as root)",
        _ => "",
    };
    io::Error::new(e.kind(), format!("{what}: {e}{hint}"))
}

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: `fd` was just returned by bpf(2) and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// An `XSKMAP`: queue index -> `AF_XDP` socket.
#[derive(Debug)]
pub struct XskMap(OwnedFd);

impl XskMap {
    /// A map for queues `0..queues`.
    pub fn new(queues: u32) -> io::Result<Self> {
        let mut a = Attr::new()
            .u32(0, BPF_MAP_TYPE_XSKMAP)
            .u32(4, 4)
            .u32(8, 4)
            .u32(12, queues.max(1));
        bpf(BPF_MAP_CREATE, &mut a)
            .map(|fd| Self(owned(fd)))
            .map_err(|e| missing(e, "BPF_MAP_CREATE (XSKMAP)"))
    }

    /// Sends queue `queue`'s frames to socket `xsk`.
    pub fn set(&self, queue: u32, xsk: i32) -> io::Result<()> {
        let key = queue;
        let val = u32::try_from(xsk).unwrap_or(0);
        let mut a = Attr::new()
            .u32(0, u32::try_from(self.0.as_raw_fd()).unwrap_or(0))
            .u64(8, std::ptr::from_ref(&key) as u64)
            .u64(16, std::ptr::from_ref(&val) as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a)
            .map(|_| ())
            .map_err(|e| missing(e, "BPF_MAP_UPDATE_ELEM (XSKMAP)"))
    }

    /// Takes queue `queue`'s socket out: its frames go on to the kernel's stack (`XDP_PASS`)
    /// until another is set. Already empty is no error.
    pub fn delete(&self, queue: u32) -> io::Result<()> {
        let key = queue;
        let mut a = Attr::new()
            .u32(0, u32::try_from(self.0.as_raw_fd()).unwrap_or(0))
            .u64(8, std::ptr::from_ref(&key) as u64);
        match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                Err(missing(e, "BPF_MAP_DELETE_ELEM (XSKMAP)"))
            }
            _ => Ok(()),
        }
    }
}

/// The loaded program.
#[derive(Debug)]
pub struct Prog(OwnedFd);

impl Prog {
    /// Loads the redirect program over `map`; `frags`: declared as taking multi-buffer frames
    /// (`BPF_F_XDP_HAS_FRAGS`: a driver then hands it frames larger than a page, and a veth
    /// lets it attach with a jumbo MTU). On a refusal the verifier's log is in the error.
    pub fn load(map: &XskMap, frags: bool) -> io::Result<Self> {
        Self::load_insns(&program(map.0.as_raw_fd()), frags, 0)
    }

    /// Loads the program that puts what the driver tells of each frame in front of it
    /// ([`META_LEN`] bytes, zero where it tells nothing): its VLAN tag if `vlan`, its RX hash
    /// if `hash`, each where the kernel has the kfunc; bound to interface `ifindex`: it
    /// attaches there alone, in native mode. Returns the program and which parts it has
    /// (`(vlan, hash)`); fails where the kernel has no BTF, none of the kfuncs asked for, or
    /// no device-bound programs.
    pub fn load_meta(
        map: &XskMap,
        frags: bool,
        ifindex: u32,
        (vlan, hash): (bool, bool),
    ) -> io::Result<(Self, (bool, bool))> {
        let id = |want: bool, name: &str| -> io::Result<Option<i32>> {
            if !want {
                return Ok(None);
            }
            match super::btf::kfunc_id(name) {
                Ok(id) => i32::try_from(id).map(Some).map_err(io::Error::other),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::info!("{e}: the XDP program goes without it");
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        };
        let (v, h) = (id(vlan, RX_VLAN_KFUNC)?, id(hash, RX_HASH_KFUNC)?);
        if v.is_none() && h.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("the kernel has neither {RX_VLAN_KFUNC} nor {RX_HASH_KFUNC} asked for"),
            ));
        }
        let prog = Self::load_insns(&program_meta(map.0.as_raw_fd(), v, h), frags, ifindex)?;
        Ok((prog, (v.is_some(), h.is_some())))
    }

    /// Loads XDP program `insns`; `ifindex` non-zero: bound to that device.
    fn load_insns(insns: &[Insn], frags: bool, ifindex: u32) -> io::Result<Self> {
        let flags = if frags { BPF_F_XDP_HAS_FRAGS } else { 0 }
            | if ifindex != 0 {
                BPF_F_XDP_DEV_BOUND_ONLY
            } else {
                0
            };
        Self::load_as((BPF_PROG_TYPE_XDP, BPF_XDP), insns, flags, ifindex)
    }

    /// Loads `insns` as a program of type `kind.0` for attach type `kind.1`, with `flags`
    /// (`prog_flags`) and `ifindex` (`prog_ifindex`).
    fn load_as(kind: (u32, u32), insns: &[Insn], flags: u32, ifindex: u32) -> io::Result<Self> {
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let load = |log: &mut [u8], level: u32| {
            let mut a = Attr::new()
                .u32(0, kind.0)
                .u32(4, u32::try_from(insns.len()).unwrap_or(0))
                .u64(8, insns.as_ptr() as u64)
                .u64(16, license.as_ptr() as u64)
                .u32(24, level)
                .u32(
                    28,
                    if level > 0 {
                        u32::try_from(log.len()).unwrap_or(0)
                    } else {
                        0
                    },
                )
                .u64(
                    32,
                    if level > 0 {
                        log.as_mut_ptr() as u64
                    } else {
                        0
                    },
                )
                .u32(44, flags)
                .u32(64, ifindex)
                .u32(68, kind.1);
            let name = b"pvnet_xsk";
            a.bytes()[48..48 + name.len()].copy_from_slice(name);
            bpf(BPF_PROG_LOAD, &mut a)
        };
        match load(&mut log, 0) {
            Ok(fd) => Ok(Self(owned(fd))),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => Err(missing(e, "BPF_PROG_LOAD")),
            Err(e) => {
                // Again with the verifier's log, for the message.
                let _ = load(&mut log, 1);
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                Err(io::Error::new(
                    e.kind(),
                    format!("BPF_PROG_LOAD: {e}; verifier: {}", text.trim()),
                ))
            }
        }
    }
}

/// The program attached to an interface: detached when dropped (or when the process dies).
#[derive(Debug)]
pub struct Link {
    _fd: OwnedFd,
}

impl Link {
    /// Attaches `prog` to interface `ifindex` (`ifname` for messages) in mode `flags`
    /// ([`XDP_FLAGS_DRV_MODE`] or [`XDP_FLAGS_SKB_MODE`]).
    pub fn attach(prog: &Prog, ifindex: u32, ifname: &str, flags: u32) -> io::Result<Self> {
        let mut a = Attr::new()
            .u32(0, u32::try_from(prog.0.as_raw_fd()).unwrap_or(0))
            .u32(4, ifindex)
            .u32(8, BPF_XDP)
            .u32(12, flags);
        let mode = if flags == XDP_FLAGS_DRV_MODE {
            "native"
        } else {
            "generic"
        };
        super::while_busy(&[libc::EBUSY, libc::EEXIST], || {
            bpf(BPF_LINK_CREATE, &mut a)
        })
        .map(|fd| Self { _fd: owned(fd) })
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY | libc::EEXIST) => io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{ifname} already has an XDP program attached: pvnet leaves it alone \
                         (detach it first, e.g. `ip link set dev {ifname} xdp off`)"
                ),
            ),
            _ => missing(e, &format!("attaching XDP to {ifname} ({mode} mode)")),
        })
    }
}

/// For tests: a program on an interface's egress (tcx, Linux 6.6) that gives each frame sent
/// with a socket mark the VLAN tag the mark names (`tpid << 16 | tci`) out of its bytes, in
/// the socket buffer, as a VLAN device or a bridge over a device with transmit VLAN offload
/// does (`bpf_skb_vlan_push`): a frame from the other end of a veth then reaches this end's
/// XDP without its tag. Frames without a mark pass as they are. Gone with the returned link.
#[cfg(test)]
pub(crate) fn tag_marked_frames_on_egress(ifindex: u32) -> io::Result<(Prog, Link)> {
    const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
    const BPF_TCX_EGRESS: u32 = 47;
    const BPF_FUNC_SKB_VLAN_PUSH: i32 = 18;
    /// `struct __sk_buff`'s `mark`.
    const SKB_MARK: i16 = 8;
    let insns = [
        insn(0xbf, 6, 1, 0, 0),
        insn(0x61, 2, 1, SKB_MARK, 0),
        // if r2 == 0 goto out
        insn(0x15, 2, 0, 6, 0),
        insn(0xbf, 3, 2, 0, 0),
        // BPF_ALU64 | BPF_AND | BPF_K: r3 &= 0xffff (the TCI); r2 >>= 16 (the TPID)
        insn(0x57, 3, 0, 0, 0xffff),
        insn(0x77, 2, 0, 0, 16),
        // BPF_ALU | BPF_END | BPF_TO_BE: r2 = htobe16(r2)
        insn(0xdc, 2, 0, 0, 16),
        insn(0xbf, 1, 6, 0, 0),
        insn(0x85, 0, 0, 0, BPF_FUNC_SKB_VLAN_PUSH),
        // out: TCX_PASS
        insn(0xb7, 0, 0, 0, 0),
        insn(0x95, 0, 0, 0, 0),
    ];
    let prog = Prog::load_as((BPF_PROG_TYPE_SCHED_CLS, BPF_TCX_EGRESS), &insns, 0, 0)?;
    let mut a = Attr::new()
        .u32(0, u32::try_from(prog.0.as_raw_fd()).unwrap_or(0))
        .u32(4, ifindex)
        .u32(8, BPF_TCX_EGRESS);
    let fd = bpf(BPF_LINK_CREATE, &mut a).map_err(|e| missing(e, "attaching tcx egress"))?;
    Ok((prog, Link { _fd: owned(fd) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instruction encoding clang gives the same program (llvm-objdump of the C source).
    #[test]
    fn the_program_is_what_clang_makes_of_the_redirect() {
        let raw = raw(&program(7));
        assert_eq!(raw[0], [0x61, 0x12, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(raw[1], [0x18, 0x11, 0, 0, 7, 0, 0, 0]);
        assert_eq!(raw[2], [0; 8]);
        assert_eq!(raw[3], [0xb7, 0x03, 0, 0, 2, 0, 0, 0]);
        assert_eq!(raw[4], [0x85, 0, 0, 0, 51, 0, 0, 0]);
        assert_eq!(raw[5], [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(size_of::<Insn>(), 8);
    }

    fn raw(p: &[Insn]) -> Vec<[u8; 8]> {
        p.iter()
            .map(|i| {
                let mut b = [0u8; 8];
                b[0] = i.code;
                b[1] = i.regs;
                b[2..4].copy_from_slice(&i.off.to_le_bytes());
                b[4..8].copy_from_slice(&i.imm.to_le_bytes());
                b
            })
            .collect()
    }

    /// The metadata form: both its jumps land on the redirect, which reads the context from
    /// r6, and each kfunc is called by id with its two pointers into the metadata.
    #[test]
    fn the_meta_program_jumps_to_the_redirect_and_calls_the_kfuncs_by_id() {
        let p = raw(&program_meta(7, Some(60_000), Some(70_000)));
        assert_eq!(p.len(), 29);
        // insn 3 (JNE) and insn 8 (JGT): pc + 1 + off = 23, the redirect.
        assert_eq!(p[3][0..4], [0x55, 0x00, 19, 0]);
        assert_eq!(p[8][0..4], [0x2d, 0x21, 14, 0]);
        // 12 bytes of metadata asked for, and zeroed.
        assert_eq!(p[1], [0xb7, 0x02, 0, 0, 0xf4, 0xff, 0xff, 0xff]);
        assert_eq!(p[11], [0x62, 0x07, 8, 0, 0, 0, 0, 0]);
        // The VLAN kfunc: r2 = r7, r3 = r7 + 2, src_reg 2, imm its id.
        assert_eq!(p[13], [0xbf, 0x72, 0, 0, 0, 0, 0, 0]);
        assert_eq!(p[15], [0x07, 0x03, 0, 0, 2, 0, 0, 0]);
        assert_eq!(p[16], [0x85, 0x20, 0, 0, 0x60, 0xea, 0, 0]);
        // The hash kfunc: r2 = r7 + 4, r3 = r7 + 8.
        assert_eq!(p[19], [0x07, 0x02, 0, 0, 4, 0, 0, 0]);
        assert_eq!(p[21], [0x07, 0x03, 0, 0, 8, 0, 0, 0]);
        assert_eq!(p[22], [0x85, 0x20, 0, 0, 0x70, 0x11, 0x01, 0]);
        // The redirect: r2 = *(u32 *)(r6 + 16).
        assert_eq!(p[23], [0x61, 0x62, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(p[28], [0x95, 0, 0, 0, 0, 0, 0, 0]);
        // One part alone: the jumps follow.
        let v = raw(&program_meta(7, Some(60_000), None));
        assert_eq!((v.len(), v[3][2], v[8][2]), (23, 13, 8));
    }
}
