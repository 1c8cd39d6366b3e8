//! The session's limits, its own messages (IOTLB, backend channel, migration, early enable)
//! and the zero-size ring, driven through a socket pair.

use super::run::take_own_message;
use super::session::*;
use super::wire::{NET_SET_MTU, SEND_RARP, SET_LOG_FD, SET_VRING_ENABLE};
use super::*;
use crate::features::{DEVICE_FEATURES, VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM};
use crate::iotlb::{IotlbMsg, Kind, HDR_LEN, HDR_NEED_REPLY, HDR_REPLY, HDR_VERSION};
use crate::ratelimit::PeerLog;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use vhost::vhost_user::message::{
    VhostUserMemoryRegion, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags,
};
use vhost::vhost_user::{VhostUserBackendReqHandlerMut, VhostUserProtocolFeatures};
use virtq::{Perm, Translate};

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

/// `NET_SET_MTU` (QEMU's `host_mtu`): taken and acked within 68 up to the port's MTU, which
/// the next started queue carries; refused with status 1 outside it, and the session goes on.
/// With an MTU configured, `VIRTIO_NET_F_MTU` is offered; without, not.
#[test]
fn net_set_mtu_is_taken_within_the_ports_mtu_and_refused_beyond() {
    use crate::features::VIRTIO_NET_F_MTU;
    assert_eq!(BackendConfig::default().offered() & VIRTIO_NET_F_MTU, 0);
    let cfg = BackendConfig {
        mtu: Some(9000),
        ..BackendConfig::default()
    };
    assert_ne!(cfg.offered() & VIRTIO_NET_F_MTU, 0);
    let s = Mutex::new(Session::new(
        3,
        cfg,
        Arc::new(NoHooks::default()),
        Arc::new(PeerLog::default()),
    ));
    s.lock().unwrap().protocol = VhostUserProtocolFeatures::REPLY_ACK.bits();
    let (mut front, back) = UnixStream::pair().unwrap();
    let need_reply = HDR_VERSION | HDR_NEED_REPLY;
    let mut status = |mtu: u64| {
        front
            .write_all(&msg(NET_SET_MTU, need_reply, &mtu.to_le_bytes()))
            .unwrap();
        assert!(take_own_message(&back, &s).unwrap());
        let mut reply = [0u8; 20];
        front.read_exact(&mut reply).unwrap();
        assert_eq!(reply[..4], NET_SET_MTU.to_le_bytes());
        u64::from_le_bytes(reply[12..].try_into().unwrap())
    };
    assert_eq!(status(9000), 0);
    assert_eq!(s.lock().unwrap().mtu, Some(9000));
    assert_eq!(status(9001), 1, "above the port's MTU");
    assert_eq!(status(67), 1, "below virtio-net's minimum");
    assert_eq!(status(1 << 40), 1, "not a u16");
    assert_eq!(status(1500), 0);
    assert_eq!(s.lock().unwrap().mtu, Some(1500));
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
    assert!(take_own_message(&back, &s).unwrap());
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
    assert!(!take_own_message(&back, &s).unwrap());
    let mut b = vec![0u8; get_features.len()];
    (&back).read_exact(&mut b).unwrap();
    assert_eq!(b, get_features);

    s.lock().unwrap().acked = VHOST_USER_F_PROTOCOL_FEATURES;
    let enable = msg(SET_VRING_ENABLE, HDR_VERSION, &vring_state(0, 1));
    front.write_all(&enable).unwrap();
    assert!(!take_own_message(&back, &s).unwrap());
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
