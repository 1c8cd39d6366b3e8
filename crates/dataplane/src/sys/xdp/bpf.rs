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
//! It is attached through a BPF link (`BPF_LINK_CREATE`, Linux 5.9+), never a netlink
//! attachment: the link belongs to the fd, so the program leaves the interface when the port
//! closes it, and also when pvnet dies. A link refuses an interface that already has a
//! program in that mode (`EBUSY`) or in the other one (`EEXIST`): pvnet leaves another
//! program alone and says so.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
/// `prog_flags`: the XDP program takes multi-buffer frames (Linux 5.18).
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
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
/// Offset of `xdp_md.rx_queue_index`.
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

/// The program's instructions, with the map's fd in the `ld_imm64`.
fn program(map_fd: i32) -> [Insn; 6] {
    [
        // BPF_LDX | BPF_MEM | BPF_W: r2 = *(u32 *)(r1 + 16)
        insn(0x61, 2, 1, XDP_MD_RX_QUEUE, 0),
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
}

/// The loaded program.
#[derive(Debug)]
pub struct Prog(OwnedFd);

impl Prog {
    /// Loads the redirect program over `map`; `frags`: declared as taking multi-buffer frames
    /// (`BPF_F_XDP_HAS_FRAGS`: a driver then hands it frames larger than a page, and a veth
    /// lets it attach with a jumbo MTU). On a refusal the verifier's log is in the error.
    pub fn load(map: &XskMap, frags: bool) -> io::Result<Self> {
        let insns = program(map.0.as_raw_fd());
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let load = |log: &mut [u8], level: u32| {
            let mut a = Attr::new()
                .u32(0, BPF_PROG_TYPE_XDP)
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
                .u32(44, if frags { BPF_F_XDP_HAS_FRAGS } else { 0 })
                .u32(68, BPF_XDP);
            let name = b"pvnet_xsk";
            a.bytes()[48..48 + name.len()].copy_from_slice(name);
            bpf(BPF_PROG_LOAD, &mut a)
        };
        match load(&mut log, 0) {
            Ok(fd) => Ok(Self(owned(fd))),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                Err(missing(e, "BPF_PROG_LOAD (XDP)"))
            }
            Err(e) => {
                // Again with the verifier's log, for the message.
                let _ = load(&mut log, 1);
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                Err(io::Error::new(
                    e.kind(),
                    format!("BPF_PROG_LOAD (XDP): {e}; verifier: {}", text.trim()),
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
        bpf(BPF_LINK_CREATE, &mut a)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The instruction encoding clang gives the same program (llvm-objdump of the C source).
    #[test]
    fn the_program_is_what_clang_makes_of_the_redirect() {
        let p = program(7);
        let raw: Vec<[u8; 8]> = p
            .iter()
            .map(|i| {
                let mut b = [0u8; 8];
                b[0] = i.code;
                b[1] = i.regs;
                b[2..4].copy_from_slice(&i.off.to_le_bytes());
                b[4..8].copy_from_slice(&i.imm.to_le_bytes());
                b
            })
            .collect();
        assert_eq!(raw[0], [0x61, 0x12, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(raw[1], [0x18, 0x11, 0, 0, 7, 0, 0, 0]);
        assert_eq!(raw[2], [0; 8]);
        assert_eq!(raw[3], [0xb7, 0x03, 0, 0, 2, 0, 0, 0]);
        assert_eq!(raw[4], [0x85, 0, 0, 0, 51, 0, 0, 0]);
        assert_eq!(raw[5], [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(size_of::<Insn>(), 8);
    }
}
