//! VLAN tags taken out of frames before XDP sees them (a VLAN device or a bridge sending
//! through a device with transmit VLAN offload, a NIC with receive VLAN offload): the port
//! puts them back from the program's metadata.

use super::{collect, no_program, Veth};
use crate::port::afxdp::AfXdpPort;
use crate::port::AnyPort;
use crate::sys::xdp::bpf::tag_marked_frames_on_egress;
use crate::sys::xdp::{ModeReq, XdpConfig, XdpDev};
use crate::testing::Collect;
use pvnet_net::HDR_LEN;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// 20 numbered frames from the kernel's end `b` of the veth, through a packet socket: every
/// other one given a tag out of its bytes by the egress program (802.1Q VLAN 10 with
/// priority 1, 802.1ad VLAN 20, or 802.1ad VLAN 40 over a tag 802.1Q 30 in its bytes).
/// Returns each frame as it should arrive, tags in its bytes, outer first.
fn send_tagged(b: &str) -> Vec<Vec<u8>> {
    let sock = crate::sys::packet::open(b).unwrap_or_else(|e| panic!("{e}"));
    let mut want = Vec::new();
    for k in 0..20u8 {
        let (mark, inline): (u32, &[u8]) = match k % 4 {
            1 => (0x8100_0000 | 0x2000 | 10, &[]),
            2 => (0x88a8_0000 | 40, &[0x81, 0x00, 0x00, 30]),
            3 => (0x88a8_0000 | 20, &[]),
            _ => (0, &[]),
        };
        let mut fr = vec![0xff; 6];
        fr.extend_from_slice(&[2, 0, 0, 0, 0x5f, k]);
        fr.extend_from_slice(inline);
        fr.extend_from_slice(&[0x88, 0xb5]);
        fr.extend_from_slice(&[k; 46]);
        crate::sys::packet::setopt_at(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            &mark,
            "SO_MARK",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let hdr = [0u8; HDR_LEN as usize];
        let iov = [
            libc::iovec {
                iov_base: hdr.as_ptr().cast_mut().cast(),
                iov_len: hdr.len(),
            },
            libc::iovec {
                iov_base: fr.as_ptr().cast_mut().cast(),
                iov_len: fr.len(),
            },
        ];
        let w = sock.send_iovecs(&iov).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w, Some(hdr.len() + fr.len()), "frame {k} sent");
        if mark != 0 {
            let tag = mark.to_be_bytes();
            fr.splice(12..12, tag);
        }
        want.push(fr);
    }
    want
}

/// What the port received from the test's source, without the header.
fn received(port: &mut AnyPort, n: usize) -> Vec<Vec<u8>> {
    let mut c = Collect::all();
    collect(port, &mut c, |c| c.got.len() >= n);
    c.got
        .into_iter()
        .map(|(h, b)| b[h as usize..].to_vec())
        .filter(|b| b.len() > 12 && b[6..11] == [2, 0, 0, 0, 0x5f])
        .collect()
}

/// Native mode on a veth whose other end tags frames out of their bytes: the program reads
/// each tag (`bpf_xdp_metadata_rx_vlan_tag`) and the port puts it back behind the frame's
/// addresses, so every frame arrives byte for byte as the far end's stack sent it, priority
/// bits and all, a tag already in the bytes kept as the inner one; untagged frames as they
/// are. With `rx_vlan=false`, and in generic mode (no such program there), the tags are lost
/// (which shows the far end really sends them out of the bytes); in generic mode until the
/// far end's transmit VLAN offload is off, as the port's log advises, and they travel in the
/// bytes.
#[test]
fn af_xdp_native_mode_puts_back_the_vlan_tags_taken_out_of_frames() {
    let (veth, _) = Veth::new("v", 56);
    let b = std::ffi::CString::new(veth.b.clone()).unwrap_or_default();
    // SAFETY: a valid NUL-terminated name.
    let bi = unsafe { libc::if_nametoindex(b.as_ptr()) };
    let _tagger = tag_marked_frames_on_egress(bi).unwrap_or_else(|e| panic!("{e}"));
    let untagged = |w: &[u8]| {
        let mut u = w.to_vec();
        if w[12..14] != [0x88, 0xb5] {
            u.drain(12..16);
        }
        u
    };
    // (mode, rx_vlan, the far end's transmit VLAN offload, tags arrive)
    for (mode, rx_vlan, offload, kept) in [
        (ModeReq::Native, true, true, true),
        (ModeReq::Native, false, true, false),
        (ModeReq::Generic, true, true, false),
        (ModeReq::Generic, true, false, true),
    ] {
        if !offload {
            let out = std::process::Command::new("ethtool")
                .args([
                    "-K",
                    &veth.b,
                    "txvlan",
                    "off",
                    "tx-vlan-stag-hw-insert",
                    "off",
                ])
                .output()
                .unwrap_or_else(|e| panic!("run ethtool: {e}"));
            assert!(out.status.success(), "{out:?}");
        }
        let dev = XdpDev::open(&XdpConfig {
            mode,
            rx_vlan,
            ..XdpConfig::new(&veth.a)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let reads = mode == ModeReq::Native && rx_vlan;
        assert_eq!(dev.meta().vlan, reads, "{}", dev.describe());
        assert_eq!(dev.describe().contains("rx-vlan"), reads);
        let mut port = AnyPort::AfXdp(AfXdpPort::new(8, Arc::default(), dev));
        let want = send_tagged(&veth.b);
        let got = received(&mut port, want.len());
        if kept {
            assert_eq!(got, want, "{mode:?}: every frame as the far end sent it");
        } else {
            let lost: Vec<Vec<u8>> = want.iter().map(|w| untagged(w)).collect();
            assert_eq!(
                got, lost,
                "{mode:?} rx_vlan={rx_vlan}: the tags beside the bytes are lost"
            );
        }
        drop(port);
        assert!(no_program(&veth.a));
    }
}
