//! The vhost-user message layer under arbitrary input: a sequence of requests, with any
//! payload and any attached fds, sent over a real socket to pvnet's backend session (the
//! `vhost` crate's framing and fd passing, pvnet's `Session` state machine behind it), in
//! process.
//!
//! Input layout, repeated until the input runs out (each message on its own `sendmsg`):
//! * byte: request code (mod 48: every request the protocol defines, and a few it does not);
//! * byte: header flags (bit 0 the version bit, bits 2-3 reply / need-reply as they are on
//!   the wire, bit 7: the size field lies, see below);
//! * byte: fds attached (low 3 bits: none, one memfd, two memfds, a pipe's read end, an
//!   eventfd, a memfd and an eventfd, 33 eventfds (one more than the crate takes), a
//!   directory); bits 3-7: the memfds' size in 4 KiB pages (1-32);
//! * byte: body length (the body follows); with the lying size bit, one more byte gives the
//!   size field instead (its value times 37, so it can pass the 4 KiB limit).
//!
//! The oracle, after the frontend hangs up:
//! * no panic (libFuzzer reports one), and no unbounded allocation (`-malloc_limit_mb` in
//!   `run.sh`);
//! * the session ended by itself and let go of everything: every queue it started is
//!   stopped, the port is gone, and this process has exactly the fds it had before;
//! * a well-behaved frontend that connects next (pvnet's own message sequence, through the
//!   crate's `Frontend`) gets both of its rings started with the sizes it asked for.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pvnet_vhost::backend::{run_session, BackendConfig, DeviceHooks, PortId, StartedQueue};
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use vhost::vhost_user::Frontend;
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtq::MemTable;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// What a dataplane would hold: the queues each port has running.
#[derive(Default)]
struct Hooks {
    running: Mutex<HashMap<PortId, HashMap<u16, u16>>>,
    gone: Mutex<Vec<PortId>>,
}

impl DeviceHooks for Hooks {
    fn port_connected(&self, port: PortId) {
        self.running.lock().unwrap().insert(port, HashMap::new());
    }
    fn start_queue(&self, port: PortId, q: StartedQueue) {
        let mut r = self.running.lock().unwrap();
        let queues = r
            .get_mut(&port)
            .expect("a queue started on a port never connected");
        let size = q.queue.size();
        assert!(
            queues.insert(q.index, size).is_none(),
            "queue {} started twice without a stop",
            q.index
        );
        // `q` drops here: its memory table reference and fds go with it, as they would
        // when a dataplane lets go of a stopped queue.
    }
    fn stop_queue(&self, port: PortId, index: u16) -> Option<u16> {
        let mut r = self.running.lock().unwrap();
        r.get_mut(&port)?.remove(&index).map(|_| 0)
    }
    fn set_mem(&self, _: PortId, _: Arc<MemTable>, _: bool) {}
    fn port_gone(&self, port: PortId) {
        let queues = self
            .running
            .lock()
            .unwrap()
            .remove(&port)
            .unwrap_or_default();
        assert!(
            queues.is_empty(),
            "port {port} gone with queues running: {queues:?}"
        );
        self.gone.lock().unwrap().push(port);
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

fn memfd(pages: u64) -> OwnedFd {
    // SAFETY: a valid NUL-terminated name; the returned fd is checked and then owned.
    let fd = unsafe { libc::memfd_create(c"fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on an fd we own.
    let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), i64::try_from(pages * 4096).unwrap()) };
    assert_eq!(rc, 0, "ftruncate");
    fd
}

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd has no memory-safety conditions; the fd is checked, then owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd");
    // SAFETY: `fd` was just created and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn pipe_read_end() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created and are owned from here on.
    let (r, _w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    r
}

fn attached(spec: u8) -> Vec<OwnedFd> {
    let pages = u64::from(spec >> 3) + 1;
    match spec & 7 {
        0 => vec![],
        1 => vec![memfd(pages)],
        2 => vec![memfd(pages), memfd(1)],
        3 => vec![pipe_read_end()],
        4 => vec![eventfd()],
        5 => vec![memfd(pages), eventfd()],
        6 => (0..33).map(|_| eventfd()).collect(),
        _ => vec![OwnedFd::from(File::open("/").expect("open /"))],
    }
}

/// Sends the input's messages, then hangs up the sending side.
fn send_all(sock: &UnixStream, mut data: &[u8]) {
    while let [code, flags, fds, len, rest @ ..] = data {
        let (lie, rest) = match (flags & 0x80 != 0, rest) {
            (true, [l, rest @ ..]) => (Some(u32::from(*l) * 37), rest),
            (true, []) => break,
            (false, rest) => (None, rest),
        };
        let n = usize::from(*len).min(rest.len());
        let (body, tail) = rest.split_at(n);
        data = tail;
        let size = lie.unwrap_or(u32::from(*len));
        let mut msg = Vec::with_capacity(12 + usize::from(*len));
        msg.extend_from_slice(&u32::from(code % 48).to_le_bytes());
        msg.extend_from_slice(&u32::from(flags & 0x7f).to_le_bytes());
        msg.extend_from_slice(&size.to_le_bytes());
        msg.extend_from_slice(body);
        // The last message is padded to the length it declares: a frontend that stops in
        // the middle of a message is covered by the lying size field already.
        msg.resize(12 + usize::from(*len), 0);
        let fds = attached(*fds);
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        if sock.send_with_fds(&[&msg[..]], &raw).is_err() {
            break; // the session hung up on us: nothing more reaches it
        }
    }
    let _ = sock.shutdown(std::net::Shutdown::Write);
}

/// pvnet's frontend's own opening sequence (split ring, 256 entries each), against a fresh
/// session: both rings must start.
fn valid_session(hooks: &Arc<Hooks>, port: PortId, cfg: BackendConfig) {
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let h: Arc<dyn DeviceHooks> = hooks.clone();
    let t = std::thread::spawn(move || run_session(theirs, port, cfg, h, Arc::default()));
    {
        let fe = Frontend::from_stream(ours, 2);
        fe.set_owner().expect("SET_OWNER");
        let offered = fe.get_features().expect("GET_FEATURES");
        let version_1 = 1u64 << 32;
        assert_ne!(offered & version_1, 0, "VERSION_1 not offered");
        fe.set_features(version_1).expect("SET_FEATURES");
        let mem = memfd(64);
        let uaddr = 0x7000_0000_0000;
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: 64 * 4096,
            userspace_addr: uaddr,
            mmap_offset: 0,
            mmap_handle: mem.as_raw_fd(),
        }])
        .expect("SET_MEM_TABLE");
        let (kick, call) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
        for q in 0..2usize {
            // Split ring of 256: descriptors 4 KiB, avail 518 B, used 2054 B; one ring per
            // 32 KiB.
            let base = uaddr + q as u64 * 0x8000;
            fe.set_vring_num(q, 256).expect("SET_VRING_NUM");
            fe.set_vring_base(q, 0).expect("SET_VRING_BASE");
            fe.set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: 256,
                    queue_size: 256,
                    flags: 0,
                    desc_table_addr: base,
                    avail_ring_addr: base + 0x1000,
                    used_ring_addr: base + 0x2000,
                    log_addr: None,
                },
            )
            .expect("SET_VRING_ADDR");
            fe.set_vring_call(q, &call).expect("SET_VRING_CALL");
            fe.set_vring_kick(q, &kick).expect("SET_VRING_KICK");
        }
        // GET_FEATURES waits for an answer: every request before it has been handled.
        fe.get_features().expect("GET_FEATURES");
        let r = hooks.running.lock().unwrap();
        let queues = r.get(&port).expect("valid session: port not connected");
        assert_eq!(
            queues.get(&0),
            Some(&256),
            "valid session: receive ring not started"
        );
        assert_eq!(
            queues.get(&1),
            Some(&256),
            "valid session: transmit ring not started"
        );
    }
    t.join().expect("session thread");
}

fuzz_target!(|data: &[u8]| {
    static IGNORE_SIGPIPE: std::sync::Once = std::sync::Once::new();
    // libFuzzer's own main runs, not Rust's: a write to a session that hung up must come
    // back as EPIPE, as it does in pvnet, not kill the fuzzer.
    // SAFETY: setting a signal's disposition to SIG_IGN has no memory-safety conditions.
    IGNORE_SIGPIPE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
    let Some((&pairs, data)) = data.split_first() else {
        return;
    };
    let before = open_fds();
    let cfg = BackendConfig {
        queue_pairs: u16::from(pairs % 4) + 1,
        ..BackendConfig::default()
    };
    let hooks = Arc::new(Hooks::default());
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    // The session reads on its own thread, as in pvnet: a request it answers never waits
    // for this side to read (replies queue in the socket buffer, and the input is small).
    let h: Arc<dyn DeviceHooks> = hooks.clone();
    let t = std::thread::spawn(move || run_session(theirs, 0, cfg, h, Arc::default()));
    send_all(&ours, data);
    t.join().expect("session thread");
    assert_eq!(
        *hooks.gone.lock().unwrap(),
        vec![0],
        "the session did not end cleanly"
    );
    drop(ours);
    valid_session(&hooks, 1, cfg);
    assert_eq!(*hooks.gone.lock().unwrap(), vec![0, 1]);
    let after = open_fds();
    assert_eq!(
        before, after,
        "fds leaked: {before} open before, {after} after"
    );
    let _ = std::io::stderr().flush();
});
