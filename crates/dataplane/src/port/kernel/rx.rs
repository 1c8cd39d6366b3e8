//! The batched receive path of a host port (io_uring): a submission of reads into the port's
//! own buffers, or straight into the receive buffers a frontend lends (direct receive,
//! docs/no-copy.md), and behind them the reads of an `AF_PACKET` port's socket of tagged
//! frames; then the packets handed out.

use super::{read_len, Uring, LARGE_IOV, LEND_IOV, RX_BUFS};
use crate::pkt::{put_back, read_head, Pkt, PortId, EMPTY, MACS, MAX_MERGE};
use crate::port::{Ingress, Lease};
use crate::stats::{bump, DropReason, PortStats};
use crate::sys::tap::RECV_BUF_LEN;
use pvnet_net::HDR_LEN;
use virtq::{read_segs, Seg};

/// Submits up to `k` reads into the port's own buffers and waits for them, and behind them
/// those of `tfd`, an `AF_PACKET` port's socket of tagged frames ([`Uring::queue_tagged`]);
/// what they read waits in `ready`. Returns whether the kernel had no more.
pub(super) fn plain_look(
    u: &mut Uring,
    (fd, tfd): (i32, Option<i32>),
    k: usize,
    stats: &PortStats,
    id: PortId,
) -> std::io::Result<bool> {
    for i in 0..k {
        let buf = u.rx[i * RECV_BUF_LEN..].as_mut_ptr();
        let len = u32::try_from(RECV_BUF_LEN).unwrap_or(u32::MAX);
        // SAFETY: buffer `i` is `RECV_BUF_LEN` bytes of `u.rx`, untouched until the
        // `complete` below returns (no packet is ready, so none points into it).
        if !unsafe { u.batch.read(fd, buf, len, i as u64) } {
            break;
        }
    }
    let tagged = u.queue_tagged(tfd, k);
    let res = complete_reads(u, stats)?;
    let mut drained = false;
    for (i, &r) in res.iter().enumerate().take(k) {
        match read_len(r, id, "tap") {
            Some(n) => u.ready.push_back((i, n)),
            None => drained = true,
        }
    }
    u.reads = (u.ready.len() * 2).clamp(1, RX_BUFS);
    let tagged_drained = u.take_tagged(&res, tagged, id);
    Ok(drained && tagged_drained)
}

/// Submits up to `k` reads into the chains of `lease` (one chain per read for small packets,
/// for large ones a single read over as many as a packet may take), each with the port's own
/// buffer behind for what does not fit, and waits for them; then [`direct_frames`]. Returns
/// the packets completed in place and whether the kernel had no more. The lease is closed
/// either way.
pub(super) fn direct_look(
    u: &mut Uring,
    (fd, tfd): (i32, Option<i32>),
    k: usize,
    lease: impl Lease,
    stats: &PortStats,
    id: PortId,
) -> std::io::Result<(usize, bool)> {
    let lent = lease.chains();
    let per = if u.large { lent.min(MAX_MERGE) } else { 1 };
    let k = if u.large { 1 } else { k.min(lent) };
    if per > 1 {
        // A packet within the first chain of a large read makes the next look small.
        u.first = lease.chain(0).iter().map(Seg::len).sum();
    }
    for i in 0..k {
        let buf = u.rx[i * RECV_BUF_LEN..].as_mut_ptr();
        let iov = if u.large {
            &mut u.riov[..LARGE_IOV]
        } else {
            &mut u.riov[i * LEND_IOV..(i + 1) * LEND_IOV]
        };
        let segs = (i * per..(i + 1) * per).flat_map(|c| lease.chain(c));
        let (n, inchain) = lend_iovecs(segs, buf, iov);
        let iov = iov.as_mut_ptr();
        u.lent[i] = inchain;
        // SAFETY: the iovecs (in `u.riov`, never reallocated) point into the lent chains of
        // read `i` (the receiver's memory, mapped while the shard holds its ring, which it
        // does for this whole call; the chains are popped for this batch, so neither the
        // frontend nor another sender writes them) and into buffer `i` of `u.rx`, untouched
        // until the `complete` below returns (no packet is ready, so none points into it).
        if !unsafe {
            u.batch
                .readv(fd, std::slice::from_raw_parts(iov, n), i as u64)
        } {
            break;
        }
    }
    let tagged = u.queue_tagged(tfd, k);
    let res = match complete_reads(u, stats) {
        Ok(res) => res,
        Err(e) => {
            lease.close(stats);
            return Err(e);
        }
    };
    let (n, gone) = direct_frames(u, &res[..k], per, lease, stats, id);
    u.reads = ((n + u.ready.len()) * 2).clamp(1, RX_BUFS);
    let tagged_drained = u.take_tagged(&res, tagged, id);
    Ok((n, gone && tagged_drained))
}

/// Submits the queued reads and waits for them: each one's result, by its buffer's index.
fn complete_reads(u: &mut Uring, stats: &PortStats) -> std::io::Result<[i32; RX_BUFS]> {
    let mut res = [0i32; RX_BUFS];
    let calls = u.batch.complete(|tag, r| {
        if let Some(x) = res.get_mut(usize::try_from(tag).unwrap_or(usize::MAX)) {
            *x = r;
        }
    })?;
    bump(&stats.syscalls, u64::from(calls));
    Ok(res)
}

/// Hands out up to `max` of the packets read (`u.ready`), in bursts of valid packets; a short
/// one is dropped in its place. Returns the packets taken.
pub(super) fn hand_out(
    u: &mut Uring,
    max: usize,
    to: &mut impl Ingress,
    stats: &PortStats,
) -> usize {
    // The VLAN tags the kernel took out go back in first (once: taken); a frame with no room
    // for its tag becomes empty, dropped below as invalid.
    for e in &mut u.ready {
        if let Some((tpid, tci)) = u.tags[e.0].take() {
            let buf = &mut u.rx[e.0 * RECV_BUF_LEN..(e.0 + 1) * RECV_BUF_LEN];
            e.1 = put_back(buf, e.1, tpid, tci).unwrap_or(0);
        }
    }
    let mut done = 0;
    while done < max && !u.ready.is_empty() {
        let mut segs: [Seg<'_>; RX_BUFS] = std::array::from_fn(|_| Seg::from_mut(&mut []));
        let mut pkts = [EMPTY; RX_BUFS];
        let mut n = 0;
        let mut invalid = false;
        {
            let mut rest: &mut [u8] = &mut u.rx;
            let mut at = 0;
            for &(i, len) in u.ready.iter().take(max - done) {
                // Buffers are handed out in increasing order within one read batch.
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(i * RECV_BUF_LEN - at);
                let (buf, tail) = tail.split_at_mut(RECV_BUF_LEN);
                rest = tail;
                at = (i + 1) * RECV_BUF_LEN;
                let l = u32::try_from(len).unwrap_or(0);
                let head = if l >= HDR_LEN + MACS {
                    read_head(&[Seg::from_mut(&mut buf[..len])], HDR_LEN)
                } else {
                    None
                };
                let Some((hdr, macs)) = head else {
                    invalid = true;
                    break;
                };
                segs[n] = Seg::from_mut(&mut buf[..len]);
                pkts[n] = Pkt {
                    segs: &[],
                    len: l,
                    hdr_len: HDR_LEN,
                    hdr,
                    macs,
                    hash: 0,
                    vlan: 0,
                };
                n += 1;
            }
        }
        for (p, s) in pkts.iter_mut().zip(segs.iter()).take(n) {
            p.segs = std::slice::from_ref(s);
        }
        let taken = if n > 0 {
            to.burst(&pkts[..n], stats)
        } else {
            0
        };
        let bytes: u64 = pkts[..taken]
            .iter()
            .map(|p| u64::from(p.len - HDR_LEN))
            .sum();
        bump(&stats.rx_packets, taken as u64);
        bump(&stats.rx_bytes, bytes);
        u.ready.drain(..taken);
        done += taken;
        if taken < n {
            break;
        }
        if invalid && n == 0 {
            // The short one heads the queue now: dropped in its place.
            u.ready.pop_front();
            bump(&stats.drops[DropReason::Invalid as usize], 1);
            bump(&stats.rx_packets, 1);
            done += 1;
        }
    }
    done
}

/// The iovecs of one direct read into `iov`: the lent chains' segments, in order (as many
/// as `iov` holds less one, [`RECV_BUF_LEN`] bytes in all), then `buf` (the port's own
/// buffer, [`RECV_BUF_LEN`] bytes) for what does not fit, so that no frame is ever cut.
/// Returns the iovecs used and the bytes that land in the chains.
fn lend_iovecs<'s>(
    segs: impl Iterator<Item = &'s Seg<'s>>,
    buf: *mut u8,
    iov: &mut [libc::iovec],
) -> (usize, u32) {
    let mut n = 0;
    let mut inchain = 0usize;
    for s in segs.take(iov.len() - 1) {
        let l = (s.len() as usize).min(RECV_BUF_LEN - inchain);
        if l == 0 {
            break;
        }
        iov[n] = libc::iovec {
            iov_base: s.as_ptr().cast(),
            iov_len: l,
        };
        n += 1;
        inchain += l;
    }
    iov[n] = libc::iovec {
        iov_base: buf.cast(),
        iov_len: RECV_BUF_LEN - inchain,
    };
    (n + 1, u32::try_from(inchain).unwrap_or(0))
}

/// The results of one batch of direct reads (`res[i]`: read `i`, into lent chains
/// `i * per..(i + 1) * per`), in order. While every packet so far was completed in place, the
/// next one is too if it lies wholly in its chains and the switch sends it to the lending
/// port as it is (it then takes the chains it fills: merged buffers, `num_buffers` set).
/// From the first one that is not (or the first read that found nothing), each packet read
/// is copied out of its chains into the port's buffer of the same index, behind what
/// overflowed there, and waits in `ready` for the usual path; its chains go back to the ring
/// at the close. Sets whether the next look reads large packets. Returns the packets
/// completed in place and whether the kernel had no more.
fn direct_frames(
    u: &mut Uring,
    res: &[i32],
    per: usize,
    mut lease: impl Lease,
    stats: &PortStats,
    id: PortId,
) -> (usize, bool) {
    let (mut direct, mut bytes) = (0usize, 0u64);
    let mut in_place = true;
    let mut drained = false;
    for (i, &r) in res.iter().enumerate() {
        let Some(n) = read_len(r, id, "tap") else {
            in_place = false;
            drained = true;
            continue;
        };
        let len = u32::try_from(n).unwrap_or(u32::MAX);
        // One chain per read, and a packet did not fit it: read the next ones large. A large
        // read whose packet fits the first chain: small again.
        if per == 1 && len > u.lent[i] {
            u.large = true;
        } else if per > 1 && len <= u.first {
            u.large = false;
        }
        // (A frame the kernel took a VLAN tag out of comes from the other socket, never
        // read into lent chains.)
        if in_place && len <= u.lent[i] && len >= HDR_LEN + MACS {
            // Completed packets are gone from the front: this one's chain is the next.
            let head = read_head(lease.chain(0), HDR_LEN);
            if let Some((hdr, macs)) = head {
                if lease.take(len, &hdr, &macs) {
                    direct += 1;
                    bytes += u64::from(len - HDR_LEN);
                    continue;
                }
            }
        }
        in_place = false;
        let buf = &mut u.rx[i * RECV_BUF_LEN..(i + 1) * RECV_BUF_LEN];
        let inchain = n.min(u.lent[i] as usize);
        buf.copy_within(0..n - inchain, inchain);
        // This read's chains, past those the packets before it took (one each: a large
        // read is the only one of its batch).
        let mut at = 0;
        let mut c = i * per - direct;
        while at < inchain {
            let chain = lease.chain(c);
            if chain.is_empty() {
                break;
            }
            at += read_segs(chain, 0, &mut buf[at..inchain]);
            c += 1;
        }
        u.ready.push_back((i, n));
    }
    lease.close(stats);
    bump(&stats.rx_packets, direct as u64);
    bump(&stats.rx_bytes, bytes);
    bump(&stats.rx_direct, direct as u64);
    (direct, drained)
}
