//! The VXLAN port over loopback in the test thread's private network namespace
//! ([`crate::sys::tap::tests::private_netns`], `lo` at MTU 1500): two ports and a plain UDP
//! socket standing for a third endpoint. Head-end replication, learning, the wire format byte
//! for byte, the checks on what arrives, the MTU, and the source ports.

use super::{header, Underlay, VxlanConfig, VxlanPort, OVERHEAD, VXLAN_HDR};
use crate::pkt::{Pkt, Staged, TxOut};
use crate::port::{AnyPort, Port};
use crate::stats::{DropReason, PortStats};
use crate::sys::tap::tests::{ip, private_netns};
use crate::testing::{frame, get, mac, Collect};
use pvnet_net::{VnetHdr, HDR_LEN};
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtq::Seg;

const PORT: u16 = 4789;

fn lo(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, k)
}

/// A port bound to 127.0.0.`local` with these remotes.
fn port(local: u8, remotes: &[u8], vni: u32, srcports: u16) -> (AnyPort, Arc<PortStats>) {
    port_gso(local, remotes, vni, srcports, false)
}

/// [`port`], with segmented sends or without.
fn port_gso(
    local: u8,
    remotes: &[u8],
    vni: u32,
    srcports: u16,
    gso: bool,
) -> (AnyPort, Arc<PortStats>) {
    let cfg = VxlanConfig {
        local: lo(local),
        remotes: remotes.iter().map(|&r| lo(r)).collect(),
        vni,
        dstport: PORT,
        srcports,
        netns: None,
        gso,
        gro: gso,
    };
    let u = Underlay::open(&cfg).unwrap_or_else(|e| panic!("open: {e}"));
    let stats: Arc<PortStats> = Arc::default();
    let p = VxlanPort::new(u32::from(local), stats.clone(), u, Duration::from_secs(300));
    (AnyPort::Vxlan(p), stats)
}

/// Sends `frames` (each behind a 12-byte header, `hash` its flow hash) through `p` as one
/// batch: what became of each.
fn send(p: &mut AnyPort, frames: &[Vec<u8>], hash: &[u32]) -> Vec<TxOut> {
    let mut bufs: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut b = vec![0u8; HDR_LEN as usize];
            b.extend_from_slice(f);
            b
        })
        .collect();
    let segs: Vec<[Seg<'_>; 1]> = bufs.iter_mut().map(|b| [Seg::from_mut(b)]).collect();
    let pkts: Vec<Pkt<'_>> = segs
        .iter()
        .zip(frames)
        .enumerate()
        .map(|(k, (s, f))| {
            let mut macs = [0u8; 12];
            macs.copy_from_slice(&f[..12]);
            Pkt {
                segs: s,
                len: HDR_LEN + u32::try_from(f.len()).unwrap_or(0),
                hdr_len: HDR_LEN,
                hdr: VnetHdr::default(),
                macs,
                hash: hash.get(k).copied().unwrap_or(0),
                vlan: 0,
            }
        })
        .collect();
    assert!(p.tx_begin(Instant::now(), pkts.len()));
    let out = pkts
        .iter()
        .map(|q| p.tx_burst(std::slice::from_ref(q)).1)
        .collect();
    p.tx_commit();
    out
}

/// Receives what arrived at `p` within a second, until `n` frames came.
fn recv(p: &mut AnyPort, n: usize) -> Vec<Vec<u8>> {
    let mut c = Collect::all();
    let deadline = Instant::now() + Duration::from_secs(1);
    while c.got.len() < n && Instant::now() < deadline {
        p.event(0);
        p.rx_burst(64, Instant::now(), &mut c);
    }
    c.got
        .into_iter()
        .map(|(h, b)| {
            assert_eq!(h, HDR_LEN);
            assert!(b[..HDR_LEN as usize].iter().all(|&x| x == 0), "no metadata");
            b[HDR_LEN as usize..].to_vec()
        })
        .collect()
}

/// Every datagram waiting on `s`: (payload, source).
fn datagrams(s: &UdpSocket) -> Vec<(Vec<u8>, std::net::SocketAddr)> {
    let mut out = Vec::new();
    let mut b = [0u8; 2048];
    while let Ok((n, from)) = s.recv_from(&mut b) {
        out.push((b[..n].to_vec(), from));
    }
    out
}

fn setup() {
    private_netns();
    ip(&["link", "set", "lo", "mtu", "1500"]);
}

fn observer(k: u8) -> UdpSocket {
    let s = UdpSocket::bind((lo(k), PORT)).expect("bind observer");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    s
}

#[test]
fn floods_to_every_remote_learns_and_sends_unicast_to_one() {
    setup();
    let (mut a, sa) = port(1, &[2, 3], 5, 1);
    let (mut b, sb) = port(2, &[1], 5, 1);
    let c = observer(3);
    assert_eq!(a.mtu(), Some(1500 - 50));
    assert_eq!(OVERHEAD, 50);
    assert!(a.caps().receives && a.caps().offloads == 0);

    // A broadcast from X: to both remotes, byte for byte behind the VXLAN header.
    let x = mac(0x11);
    let bcast = frame([0xff; 6], x, 1, 60);
    assert_eq!(
        send(&mut a, std::slice::from_ref(&bcast), &[]),
        [TxOut::Sent]
    );
    assert_eq!(get(&sa.tx_packets), 2, "one datagram per remote");
    assert_eq!(get(&sa.tx_bytes), 120);
    assert_eq!(recv(&mut b, 1), std::slice::from_ref(&bcast));
    let got = datagrams(&c);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0[..8], header(5));
    assert_eq!(got[0].0[..8], [0x08, 0, 0, 0, 0, 0, 5, 0]);
    assert_eq!(got[0].0[8..], bcast[..]);
    assert_eq!(got[0].1.port(), PORT, "srcports=1: from dstport");
    assert_eq!((get(&sb.rx_packets), get(&sb.rx_bytes)), (1, 60));

    // The third endpoint (a plain socket) sends from Y: A learns Y behind it.
    let y = mac(0x22);
    let mut d = header(5).to_vec();
    d.extend_from_slice(&frame(x, y, 2, 60));
    c.send_to(&d, (lo(1), PORT)).expect("send");
    let from_y = recv(&mut a, 1);
    assert_eq!(from_y.len(), 1);
    assert_eq!(from_y[0][6..12], y);
    if let AnyPort::Vxlan(v) = &a {
        assert_eq!(v.learned(Instant::now()), [(y, lo(3))]);
    }
    // Unicast to Y: to the third endpoint only; to an unknown address: to both.
    let to_y = frame(y, x, 3, 100);
    assert_eq!(
        send(&mut a, std::slice::from_ref(&to_y), &[]),
        [TxOut::Sent]
    );
    let got = datagrams(&c);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0[8..], to_y[..]);
    let unknown = frame(mac(0x33), x, 4, 80);
    assert_eq!(
        send(&mut a, std::slice::from_ref(&unknown), &[]),
        [TxOut::Sent]
    );
    assert_eq!(
        recv(&mut b, 1),
        std::slice::from_ref(&unknown),
        "B gets the unknown unicast only"
    );
    assert_eq!(datagrams(&c).len(), 1);
    assert_eq!(get(&sa.tx_packets), 2 + 1 + 2);
    assert_eq!(get(&sb.rx_packets), 2, "nothing else reached B");
    // B learned X behind A; its answer goes to A.
    let back = frame(x, mac(0x44), 5, 64);
    assert_eq!(
        send(&mut b, std::slice::from_ref(&back), &[]),
        [TxOut::Sent]
    );
    assert_eq!(recv(&mut a, 1), [back]);
    let drops: u64 = sa.drops.iter().map(get).sum();
    assert_eq!(drops + drops_of(&sb), 0);
}

fn drops_of(s: &PortStats) -> u64 {
    s.drops.iter().map(get).sum()
}

#[test]
fn drops_and_counts_what_is_not_its_vxlan() {
    setup();
    let (mut a, sa) = port(11, &[12], 7, 1);
    let peer = observer(12);
    let stranger = observer(13);
    let inner = frame(mac(1), mac(2), 0, 60);
    let with = |h: [u8; 8]| {
        let mut d = h.to_vec();
        d.extend_from_slice(&inner);
        d
    };
    let to = (lo(11), PORT);
    peer.send_to(&with(header(8)), to).expect("send"); // another VNI
    peer.send_to(&with([0x0c, 0, 0, 0, 0, 0, 7, 0]), to)
        .expect("send"); // a reserved flag
    peer.send_to(&with([0, 0, 0, 0, 0, 0, 7, 0]), to)
        .expect("send"); // no I flag
    peer.send_to(&with([0x08, 0, 0, 0, 0, 0, 7, 1]), to)
        .expect("send"); // reserved byte
    peer.send_to(&header(7)[..], to).expect("send"); // no frame
    peer.send_to(&with(header(7))[..8 + 13], to).expect("send"); // a short one
    stranger.send_to(&with(header(7)), to).expect("send"); // not a remote
    peer.send_to(&with(header(7)), to).expect("send"); // the one good one
    let got = recv(&mut a, 1);
    assert_eq!(got, std::slice::from_ref(&inner));
    // Everything counted: 8 in, 1 delivered, 6 invalid, 1 filtered.
    let deadline = Instant::now() + Duration::from_secs(1);
    while get(&sa.rx_packets) < 8 && Instant::now() < deadline {
        a.event(0);
        a.rx_burst(64, Instant::now(), &mut Collect::all());
    }
    assert_eq!(get(&sa.rx_packets), 8);
    assert_eq!(get(&sa.rx_bytes), 60);
    assert_eq!(get(&sa.drops[DropReason::Invalid as usize]), 6);
    assert_eq!(get(&sa.drops[DropReason::Filtered as usize]), 1);
    assert_eq!(drops_of(&sa), 7);
}

#[test]
fn a_frame_past_the_underlay_mtu_is_too_big_and_flows_spread_over_source_ports() {
    setup();
    let (mut a, _sa) = port(21, &[22], 9, 4);
    let c = observer(22);
    // 1450 + 14: the largest frame; a tagged one 4 bytes longer passes the switch's check
    // (MTU + 18) but not the underlay's.
    let fits = frame(mac(1), mac(2), 0, 1450 + 14);
    let over = frame(mac(1), mac(2), 0, 1450 + 18);
    assert_eq!(
        send(&mut a, &[fits.clone(), over], &[]),
        [TxOut::Sent, TxOut::Dropped(DropReason::TooBig)]
    );
    let got = datagrams(&c);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.len(), fits.len() + VXLAN_HDR as usize);
    // 64 flows: several source ports, none of them dstport, one per flow.
    let frames: Vec<Vec<u8>> = (0..64u8).map(|k| frame(mac(1), mac(2), k, 60)).collect();
    let hashes: Vec<u32> = (0..64u32).map(|k| k.wrapping_mul(0x9e37_79b9)).collect();
    send(&mut a, &frames, &hashes);
    let got = datagrams(&c);
    assert_eq!(got.len(), 64);
    let ports: std::collections::BTreeSet<u16> = got.iter().map(|d| d.1.port()).collect();
    assert!(ports.len() > 1 && !ports.contains(&PORT), "{ports:?}");
    // The same flow again: the same source port (datagrams of several sockets arrive in any
    // order: a frame is known by its fill byte).
    let port_of = |k: u8| got.iter().find(|d| d.0[8 + 14] == k).map(|d| d.1.port());
    send(&mut a, &frames[..1], &hashes[..1]);
    let again = datagrams(&c);
    assert_eq!(Some(again[0].1.port()), port_of(0));
}

/// A packet the switch staged (a completed checksum, a segment) is copied when the switch
/// says so (`staged`): the datagram carries what the packet held then, though its memory is
/// overwritten before the commit.
#[test]
fn a_staged_packet_is_sent_as_it_was_when_taken() {
    setup();
    let (mut a, sa) = port(31, &[32], 3, 1);
    let c = observer(32);
    let first = frame(mac(1), mac(2), 1, 60);
    let mut buf = vec![0u8; HDR_LEN as usize];
    buf.extend_from_slice(&first);
    let mut macs = [0u8; 12];
    macs.copy_from_slice(&first[..12]);
    assert!(a.tx_begin(Instant::now(), 2));
    for k in 0..2u8 {
        let seg = [Seg::from_mut(&mut buf)];
        let p = Pkt {
            segs: &seg,
            len: HDR_LEN + 60,
            hdr_len: HDR_LEN,
            hdr: VnetHdr::default(),
            macs,
            hash: 0,
            vlan: 0,
        };
        assert_eq!(a.tx_burst(&[p]), (1, TxOut::Sent));
        a.staged(1, Staged::Whole);
        // The switch's staging buffer: the next packet overwrites it.
        buf[HDR_LEN as usize + 14..].fill(k + 2);
    }
    a.tx_commit();
    let got = datagrams(&c);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0[8..], first[..]);
    assert_eq!(got[1].0[8 + 14..], [2u8; 60 - 14]);
    assert_eq!(get(&sa.tx_packets), 2);
}

/// A burst of re-cut packets (the switch's 802.1Q path: each frame's new addresses and tag
/// in memory of the switch's, the rest in the sender's) staged at once (`staged(n, Head)`):
/// every datagram carries what its packet held when taken, though the switch reuses that
/// memory before the commit, and the burst still goes as one segmented send.
#[test]
fn a_staged_burst_of_recut_packets_is_sent_whole_and_as_one_run() {
    setup();
    let (mut a, sa) = port_gso(33, &[34], 3, 1, true);
    let c = observer(34);
    const N: usize = 8;
    // What each packet becomes on the wire: addresses, tag, the rest (its sequence byte).
    let frames: Vec<Vec<u8>> = (0..N)
        .map(|k| {
            let f = frame(mac(1), mac(2), u8::try_from(k).unwrap_or(0), 60);
            let mut t = f[..12].to_vec();
            t.extend_from_slice(&[0x81, 0x00, 0x00, 10]);
            t.extend_from_slice(&f[12..]);
            t
        })
        .collect();
    // The switch's heads (virtio-net header, addresses, tag) and the senders' rests.
    let mut heads: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut h = vec![0u8; HDR_LEN as usize];
            h.extend_from_slice(&f[..16]);
            h
        })
        .collect();
    let mut rests: Vec<Vec<u8>> = frames.iter().map(|f| f[16..].to_vec()).collect();
    assert!(a.tx_begin(Instant::now(), N));
    {
        let segs: Vec<[Seg<'_>; 2]> = heads
            .iter_mut()
            .zip(rests.iter_mut())
            .map(|(h, r)| [Seg::from_mut(h), Seg::from_mut(r)])
            .collect();
        let pkts: Vec<Pkt<'_>> = segs
            .iter()
            .zip(&frames)
            .map(|(s, f)| {
                let mut macs = [0u8; 12];
                macs.copy_from_slice(&f[..12]);
                Pkt {
                    segs: s,
                    len: HDR_LEN + 64,
                    hdr_len: HDR_LEN,
                    hdr: VnetHdr::default(),
                    macs,
                    hash: 0,
                    vlan: 0,
                }
            })
            .collect();
        assert_eq!(a.tx_burst(&pkts), (N, TxOut::Sent));
        a.staged(N, Staged::Head);
    }
    // The switch reuses its heads for its next burst before this one is committed.
    for h in &mut heads {
        h.fill(0xee);
    }
    a.tx_commit();
    let got = datagrams(&c);
    assert_eq!(got.len(), N);
    for (d, f) in got.iter().zip(&frames) {
        assert_eq!(d.0[..8], header(3));
        assert_eq!(d.0[8..], f[..]);
    }
    assert_eq!(get(&sa.tx_packets), N as u64);
    assert_eq!(get(&sa.syscalls), 1, "one segmented send");
    assert_eq!(drops_of(&sa), 0);
}

/// Segmented sends (`UDP_SEGMENT`): runs of equal-sized frames to one remote go in one call,
/// a shorter frame ends a run, a flood's copies are not a run; every datagram arrives as if
/// sent alone, in order, header and frame byte for byte.
#[test]
fn runs_of_equal_frames_go_as_one_segmented_send() {
    setup();
    let (mut a, sa) = port_gso(41, &[42], 4, 1, true);
    let c = observer(42);
    let sizes = [60usize, 60, 60, 50, 60, 60, 100];
    let frames: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| frame(mac(1), mac(2), u8::try_from(k).unwrap_or(0), n))
        .collect();
    assert!(send(&mut a, &frames, &[]).iter().all(|&o| o == TxOut::Sent));
    let got = datagrams(&c);
    assert_eq!(got.len(), frames.len());
    for (d, f) in got.iter().zip(&frames) {
        assert_eq!(d.0[..8], header(4));
        assert_eq!(d.0[8..], f[..]);
    }
    assert_eq!(get(&sa.tx_packets), 7);
    // [60 60 60 50] [60 60 100]: two calls.
    assert_eq!(get(&sa.syscalls), 2);
    // 64 more of one size: one call.
    let many: Vec<Vec<u8>> = (0..64u8).map(|k| frame(mac(1), mac(2), k, 64)).collect();
    send(&mut a, &many, &[]);
    let got = datagrams(&c);
    assert_eq!(got.len(), 64);
    assert!(got.iter().zip(&many).all(|(d, f)| d.0[8..] == f[..]));
    assert_eq!(get(&sa.syscalls), 3);
    assert_eq!(drops_of(&sa), 0);
    if let AnyPort::Vxlan(v) = &a {
        assert!(v.gso, "the kernel took the segmented sends");
    }
}

/// Coalesced reads (`UDP_GRO`): a segmented send from one port reaches the other's socket
/// whole and is split back into its datagrams, every frame checked and handed out in order,
/// the first in place and the rest behind the shared zero header; a datagram of the run
/// with another VNI is dropped alone.
#[test]
fn a_coalesced_run_is_split_back_into_its_frames() {
    setup();
    let (mut a, _sa) = port_gso(51, &[52], 6, 1, true);
    let (mut b, sb) = port_gso(52, &[51], 6, 1, true);
    let frames: Vec<Vec<u8>> = (0..64u8).map(|k| frame(mac(1), mac(2), k, 60)).collect();
    send(&mut a, &frames, &[]);
    let got = recv(&mut b, 64);
    assert_eq!(got, frames);
    assert_eq!(get(&sb.rx_packets), 64);
    assert!(
        get(&sb.syscalls) < 64,
        "{} reads for 64 datagrams",
        get(&sb.syscalls)
    );
    if let AnyPort::Vxlan(v) = &b {
        assert!(v.rx.gro);
        // All 64 came in one read, into the first slot: one coalesced run.
        assert_eq!(v.rx.n, 64);
        assert!((v.rx.ready[63].0 as usize) < v.rx.slot, "one run");
        assert!(
            !v.rx.ready[1].2,
            "the second frame behind the shared header"
        );
    }
    // A run from a remote's address whose third datagram carries another VNI: that one
    // alone is dropped; the others are delivered, in order.
    let s = crate::sys::udp::UdpSock::bind(lo(51), 0).expect("bind");
    let mut run = Vec::new();
    for k in 0..4u8 {
        run.extend_from_slice(&header(if k == 2 { 7 } else { 6 }));
        run.extend_from_slice(&frame(mac(1), mac(3), 10 + k, 60));
    }
    let mut iov = libc::iovec {
        iov_base: run.as_mut_ptr().cast(),
        iov_len: run.len(),
    };
    let to = crate::sys::udp::sockaddr(lo(52), PORT);
    // SAFETY: one iovec over `run`, alive for the call.
    unsafe { s.send_segmented(&to, &raw mut iov, 1, 68) }.expect("segmented send");
    let before = get(&sb.rx_packets);
    let got = recv(&mut b, 3);
    assert_eq!(
        got.iter().map(|f| f[20]).collect::<Vec<u8>>(),
        [10, 11, 13],
        "the frames' fill bytes"
    );
    assert_eq!(get(&sb.rx_packets), before + 4);
    assert_eq!(get(&sb.drops[DropReason::Invalid as usize]), 1);
}

/// A named network namespace, made here and deleted on drop.
struct NamedNs(String);

impl Drop for NamedNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .output();
    }
}

/// `netns=`: the sockets are opened in a named namespace while the thread stays in its own:
/// the address is free here, and a datagram sent inside that namespace reaches the port.
#[test]
fn sockets_open_in_the_named_namespace() {
    setup();
    let ns = NamedNs(format!("pvnet-{}-vxns", std::process::id()));
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &ns.0])
        .output();
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    let cfg = VxlanConfig {
        local: lo(1),
        remotes: vec![lo(2)],
        vni: 8,
        dstport: PORT,
        srcports: 1,
        netns: Some(ns.0.clone()),
        gso: false,
        gro: false,
    };
    let u = Underlay::open(&cfg).unwrap_or_else(|e| panic!("open: {e}"));
    assert!(u.describe().contains(&ns.0));
    let stats: Arc<PortStats> = Arc::default();
    let mut p = AnyPort::Vxlan(VxlanPort::new(1, stats, u, Duration::from_secs(300)));
    drop(UdpSocket::bind((lo(1), PORT)).expect("the address is free in the thread's namespace"));
    let inner = frame(mac(1), mac(2), 5, 60);
    let mut d = header(8).to_vec();
    d.extend_from_slice(&inner);
    crate::sys::udp::in_netns(&ns.0, move || {
        let s = UdpSocket::bind((lo(2), 0))?;
        s.send_to(&d, (lo(1), PORT)).map(|_| ())
    })
    .expect("send inside the namespace");
    assert_eq!(recv(&mut p, 1), std::slice::from_ref(&inner));
}
