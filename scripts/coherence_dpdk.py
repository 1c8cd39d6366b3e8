#!/usr/bin/env python3
"""Two-agent cache-line ownership model for DPDK 22.11 vhost <-> virtio PMD.

Research aid for /work/notes/dpdk_coherence.md.  Each path below is a
hand-transcription of the memory accesses that DPDK v22.11 performs on
*shared* memory (vring + guest buffers); private memory (shadow rings,
vq_descx, mbuf structs, vhost-side mbufs, iova tables) is omitted.
Line numbers in labels refer to v22.11 lib/vhost/virtio_net.c (vn:),
lib/vhost/vhost.h (vh:), drivers/net/virtio/virtio_rxtx.c (rx:),
drivers/net/virtio/virtqueue.h (vq:).

Model: agents DEV (vhost) and DRV (virtio PMD), private infinite caches,
64 B lines.  read: transfer iff reader does not hold the line and the
last writer is the other agent.  write: transfer iff the other agent
holds the line; 'upg' if the writer already holds a (shared) copy,
'rfo' if it did not.
"""
import collections

LINE = 64
RING = 256
B = 32            # batch
HDR = 12          # virtio_net_hdr_mrg_rxbuf
DEV, DRV = 'dev', 'drv'


class Mem:
    def __init__(self):
        self.holders = collections.defaultdict(set)
        self.lastw = {}
        self.vals = {}            # for ASSIGN_UNLESS_EQUAL-style stores
        self.count = False
        self.stats = collections.Counter()

    def _lines(self, addr, size):
        return range(addr // LINE, (addr + size - 1) // LINE + 1)

    def rd(self, a, addr, size, tag):
        for l in self._lines(addr, size):
            h = self.holders[l]
            if a not in h:
                if self.lastw.get(l) not in (None, a) and self.count:
                    self.stats[(a, 'rd', tag)] += 1
                h.add(a)

    def wr(self, a, addr, size, tag):
        o = DEV if a == DRV else DRV
        for l in self._lines(addr, size):
            h = self.holders[l]
            if o in h and self.count:
                self.stats[(a, 'wr_upg' if a in h else 'wr_rfo', tag)] += 1
            self.holders[l] = {a}
            self.lastw[l] = a

    def assign(self, a, addr, size, val, tag):
        """if (*p != val) *p = val;"""
        self.rd(a, addr, size, tag)
        if self.vals.get(addr) != val:
            self.wr(a, addr, size, tag)
            self.vals[addr] = val


# ---------------- layout -------------------------------------------------
S_DESC = 0x100000                 # vring_init_split: desc, avail, used
S_AVAIL = S_DESC + RING * 16      # virtio_ring.h vring_init_split
S_USED = S_DESC + 8192            # RTE_ALIGN_CEIL(&avail->ring[num], 4096)
P_DESC = 0x200000                 # vring_init_packed
P_DRVEVT = P_DESC + RING * 16
P_DEVEVT = P_DESC + 8192
NBUF = 1024


def buf(k):
    """mbuf object k: 128 B rte_mbuf, then data buffer (buf_addr).
    vnet hdr at buf_addr+128-12 (RX refill vq: VIRTIO_MBUF_ADDR+HEADROOM-hdr;
    TX can_push prepends into headroom); frame starts at buf_addr+128."""
    base = 0x10000000 + k * 4096
    bufaddr = base + 128
    return bufaddr + 128 - HDR, bufaddr + 128   # (hdr addr, frame addr)


def frame_lines(frame):
    return (frame + LINE - 1) // LINE


def dev_flush_used_split(s, ids):
    """The device's end of a split burst, both directions: the shadow used entries copied
    out (flush_shadow_used_ring_split vn:278, rte_memcpy vn:269), used->idx added (vn:300),
    then the call check (vhost_vring_call_split)."""
    m = s.m
    for i, d in enumerate(ids):
        u = (s.last_used + i) % RING
        m.wr(DEV, S_USED + 4 + 8 * u, 8, 'used_ent')
        s.used_ring[u] = d
    s.last_used += B
    m.rd(DEV, S_USED + 2, 2, 'used_idx'); m.wr(DEV, S_USED + 2, 2, 'used_idx')  # vn:300
    s.used_idx += B
    if s.eidx:
        m.rd(DEV, S_AVAIL + 4 + 2 * RING, 2, 'event')     # vh:881 used_event
    else:
        m.rd(DEV, S_AVAIL + 0, 2, 'event')                # vh:892 avail->flags


# ---------------- split ring, v2h (TX queue) ------------------------------
class SplitTx:
    def __init__(s, m, frame, drv_writes_lines, lazy, event_idx):
        s.m, s.frame, s.dwl, s.lazy, s.eidx = m, frame, drv_writes_lines, lazy, event_idx
        s.avail_idx = 0; s.used_cons = 0; s.last_avail = 0; s.last_used = 0
        s.head = 0; s.tail = None; s.nxt = {i: i + 1 for i in range(RING - 1)}
        s.nxt[RING - 1] = None; s.free = RING; s.bufof = {}; s.nb = 0
        s.used_idx = 0

    def d_addr(s, i): return S_DESC + 16 * i

    def cleanup(s, n):                      # vq.h:927 virtio_xmit_cleanup
        m = s.m
        for _ in range(n):
            u = s.used_cons % RING
            m.rd(DRV, S_USED + 4 + 8 * u, 4, 'used_ent')      # vq.h:938 uep->id
            d = s.used_ring[u]
            s.used_cons += 1
            # rx:50 vq_ring_free_chain
            m.rd(DRV, s.d_addr(d) + 12, 2, 'desc')            # dp->flags rx:59
            if s.tail is None:
                s.head = d
            else:
                m.wr(DRV, s.d_addr(s.tail) + 14, 2, 'desc')   # dp_tail->next rx:76
                s.nxt[s.tail] = d
            s.tail = d
            m.wr(DRV, s.d_addr(d) + 14, 2, 'desc')            # dp->next=END rx:80
            s.nxt[d] = None
            s.free += 1

    def drv_post(s):                        # rx:1848 virtio_xmit_pkts
        m = s.m
        m.rd(DRV, S_USED + 2, 2, 'used_idx')                  # rx:1864 virtqueue_nused
        nb_used = s.used_idx - s.used_cons
        if s.lazy and nb_used > RING - 32:                    # rx:1866 (free_thresh 32)
            s.cleanup(nb_used)
        for i in range(B):
            if s.free < 1:                                    # rx:1896
                s.cleanup(min(1, s.used_idx - s.used_cons))
            k = s.nb % NBUF; s.nb += 1
            h, f = buf(k)
            # testpmd txonly pkt_burst_prepare writes the frame
            for L in range(s.dwl):
                m.wr(DRV, f + 64 * L, min(64, s.frame - 64 * L), 'data')
            # rx:541 virtqueue_enqueue_xmit, can_push
            for off, sz in ((2, 2), (4, 2), (0, 1), (1, 1), (6, 2), (8, 2)):
                m.assign(DRV, h + off, sz, 0, 'hdr')          # vq.h:650 clear_net_hdr
            d = s.head
            m.wr(DRV, s.d_addr(d), 12, 'desc')                # addr,len rx:608-613
            m.wr(DRV, s.d_addr(d) + 12, 2, 'desc')            # flags rx:615
            m.rd(DRV, s.d_addr(d) + 14, 2, 'desc')            # next rx:616
            s.head = s.nxt[d]
            if s.head is None:
                s.tail = None
            s.free -= 1
            slot = s.avail_idx % RING
            m.assign(DRV, S_AVAIL + 4 + 2 * slot, 2, d, 'avail_ent')  # vq.h:574
            s.avail_idx += 1
            s.bufof[d] = (h, f)
        m.wr(DRV, S_AVAIL + 2, 2, 'avail_idx')                # vq.h:551
        m.rd(DRV, S_USED + 0, 2, 'event')                     # vq.h:587 used->flags

    def dev(s):                              # vn:2853 virtio_dev_tx_split
        m = s.m
        m.rd(DEV, S_AVAIL + 2, 2, 'avail_idx')                # vn:2866
        m.rd(DEV, S_AVAIL + 4 + 2 * (s.last_avail % RING), 2, 'avail_ent')  # prefetch vn:2871
        deferred = []
        if not hasattr(s, 'used_ring'):
            s.used_ring = {}
        ids = []
        for i in range(B):
            slot = (s.last_avail + i) % RING
            m.rd(DEV, S_AVAIL + 4 + 2 * slot, 2, 'avail_ent')  # vn:711
            d = m.vals[S_AVAIL + 4 + 2 * slot]
            m.rd(DEV, s.d_addr(d), 16, 'desc')                 # vn:725,760,764,770
            h, f = s.bufof[d]
            m.rd(DEV, h, 1, 'hdr')                             # rte_prefetch0 vn:690
            ids.append(d)
            for L in range(frame_lines(s.frame)):              # desc_to_mbuf
                if s.frame <= 256:
                    deferred.append(f + 64 * L)                # sync_fill_seg vn:1131 (batch)
                else:
                    m.rd(DEV, f + 64 * L, 1, 'data')           # rte_memcpy vn:1119
        for a in deferred:
            m.rd(DEV, a, 1, 'data')                            # do_data_copy_dequeue vn:2943
        s.last_avail += B
        dev_flush_used_split(s, ids)

    def drv_reclaim(s):
        if not s.lazy:
            s.m.rd(DRV, S_USED + 2, 2, 'used_idx')
            s.cleanup(s.used_idx - s.used_cons)

    def step(s):
        s.drv_post(); s.dev(); s.drv_reclaim()


# ---------------- split ring, h2v (RX queue) ------------------------------
class SplitRx:
    def __init__(s, m, frame, drv_prefetch_data, event_idx, dpdk_2211_11=False):
        s.m, s.frame, s.pf, s.eidx = m, frame, drv_prefetch_data, event_idx
        s.avail_idx = 0; s.used_cons = 0; s.last_avail = 0; s.last_used = 0
        s.head = 0; s.tail = None; s.nxt = {i: i + 1 for i in range(RING - 1)}
        s.nxt[RING - 1] = None; s.free = RING; s.bufof = {}; s.nb = 0
        s.used_idx = 0; s.used_ring = {}
        s.refill(RING)                                         # queue setup
        m.wr(DRV, S_AVAIL + 2, 2, 'avail_idx')

    def d_addr(s, i): return S_DESC + 16 * i

    def refill(s, n):                         # rx:282 virtqueue_enqueue_recv_refill
        m = s.m
        for _ in range(n):
            d = s.head
            k = s.nb % NBUF; s.nb += 1
            s.bufof[d] = buf(k)
            m.wr(DRV, s.d_addr(d), 12, 'desc')                 # addr,len rx:304-306
            m.wr(DRV, s.d_addr(d) + 12, 2, 'desc')             # flags rx:308
            m.rd(DRV, s.d_addr(d) + 14, 2, 'desc')             # next rx:309
            s.head = s.nxt[d]
            if s.head is None:
                s.tail = None
            slot = s.avail_idx % RING
            m.assign(DRV, S_AVAIL + 4 + 2 * slot, 2, d, 'avail_ent')  # vq.h:574
            s.avail_idx += 1
            s.free -= 1

    def dev(s):                               # vn:1331 virtio_dev_rx_split
        m = s.m
        m.rd(DEV, S_AVAIL + 2, 2, 'avail_idx')                 # vn:1343
        m.rd(DEV, S_AVAIL + 4 + 2 * (s.last_avail % RING), 2, 'avail_ent')  # vn:1345
        deferred = []; ids = []
        for i in range(B):
            slot = (s.last_avail + i) % RING
            m.rd(DEV, S_AVAIL + 4 + 2 * slot, 2, 'avail_ent')  # vn:711
            d = m.vals[S_AVAIL + 4 + 2 * slot]
            m.rd(DEV, s.d_addr(d), 16, 'desc')                 # vn:725..770
            h, f = s.bufof[d]
            m.rd(DEV, h, 1, 'hdr')                             # prefetch vn:690
            # vn:1220 virtio_enqueue_offload: ASSIGN_UNLESS_EQUAL on 6 fields
            for off, sz in ((6, 2), (8, 2), (0, 1), (1, 1), (4, 2), (2, 2)):
                m.assign(DEV, h + off, sz, 0, 'hdr')
            m.assign(DEV, h + 10, 2, 1, 'hdr')                 # num_buffers vn:1222
            ids.append(d)
            for L in range(frame_lines(s.frame)):
                if s.frame <= 256:
                    deferred.append(f + 64 * L)                # vn:1124 batch_copy
                else:
                    m.wr(DEV, f + 64 * L, min(64, s.frame - 64 * L), 'data')  # vn:1113
        for a in deferred:
            m.wr(DEV, a, 1, 'data')                            # do_data_copy_enqueue vn:1373
        s.last_avail += B
        dev_flush_used_split(s, ids)

    def drv(s):                               # rx:1376 virtio_recv_mergeable_pkts
        m = s.m
        m.rd(DRV, S_USED + 2, 2, 'used_idx')                   # rx:1398
        n = s.used_idx - s.used_cons
        got = []
        for _ in range(n):                                     # rx:170 dequeue_burst_rx
            u = s.used_cons % RING
            m.rd(DRV, S_USED + 4 + 8 * u, 8, 'used_ent')       # id,len rx:182-183
            d = s.used_ring[u]
            h, f = s.bufof[d]
            if s.pf:
                m.rd(DRV, f, 1, 'data')                        # rte_packet_prefetch rx:193
            s.used_cons += 1
            m.rd(DRV, s.d_addr(d) + 12, 2, 'desc')             # free_chain rx:59
            if s.tail is None:
                s.head = d
            else:
                m.wr(DRV, s.d_addr(s.tail) + 14, 2, 'desc')    # rx:76
                s.nxt[s.tail] = d
            s.tail = d
            m.wr(DRV, s.d_addr(d) + 14, 2, 'desc')             # rx:80
            s.nxt[d] = None
            s.free += 1
            got.append(h)
        for h in got:
            m.rd(DRV, h + 10, 2, 'hdr')                        # num_buffers rx:1431
        s.refill(s.free)                                       # rx:1527
        m.wr(DRV, S_AVAIL + 2, 2, 'avail_idx')                 # rx:1542
        m.rd(DRV, S_USED + 0, 2, 'event')                      # rx:1544

    def step(s):
        s.dev(); s.drv()


# ---------------- packed ring, v2h ---------------------------------------
class PackedTx:
    def __init__(s, m, frame, dwl, lazy, event_idx):
        s.m, s.frame, s.dwl, s.lazy, s.eidx = m, frame, dwl, lazy, event_idx
        s.avail = 0; s.free = RING; s.cons = 0; s.last_avail = 0; s.last_used = 0
        s.bufof = {}; s.nb = 0; s.used = 0
        m.wr(DRV, P_DRVEVT, 4, 'event')       # virtqueue_disable_intr_packed (setup)
        m.wr(DEV, P_DEVEVT, 4, 'event')       # vhost_enable_notify_packed(0) (setup)

    def da(s, i): return P_DESC + 16 * (i % RING)

    def cleanup(s, n):                        # vq.h:888 cleanup_normal_packed
        m = s.m
        while n and s.cons < s.used:
            m.rd(DRV, s.da(s.cons) + 14, 2, 'desc')           # desc_is_used vq.h:899
            m.rd(DRV, s.da(s.cons) + 12, 2, 'desc')           # id vq.h:900
            s.cons += 1; s.free += 1; n -= 1

    def drv_post(s):                           # rx:1766 virtio_xmit_pkts_packed
        m = s.m
        if s.lazy and B > s.free:
            s.cleanup(B - s.free)                             # rx:1784
        for i in range(B):
            k = s.nb % NBUF; s.nb += 1
            h, f = buf(k)
            for L in range(s.dwl):
                m.wr(DRV, f + 64 * L, min(64, s.frame - 64 * L), 'data')
            for off, sz in ((2, 2), (4, 2), (0, 1), (1, 1), (6, 2), (8, 2)):
                m.assign(DRV, h + off, sz, 0, 'hdr')          # rx:516
            a = s.da(s.avail)
            m.wr(DRV, a, 14, 'desc')                          # addr,len,id rx:520-522
            m.wr(DRV, a + 14, 2, 'desc')                      # flags rx:537
            s.bufof[s.avail % RING] = (h, f)
            s.avail += 1; s.free -= 1
        m.rd(DRV, P_DEVEVT + 2, 2, 'event')                   # vq.h:599

    def dev(s):                                # vn:3166 virtio_dev_tx_packed
        m = s.m
        first = True
        for g in range(B // 4):
            base = s.last_avail
            m.rd(DEV, s.da(base), 1, 'desc')                  # prefetch vn:3179
            for i in range(4):                                # vn:2993,3003,3007,3034
                m.rd(DEV, s.da(base + i), 16, 'desc')
            hf = [s.bufof[(base + i) % RING] for i in range(4)]
            for h, f in hf:
                m.rd(DEV, h, 1, 'hdr')                        # prefetch vn:3061
            for h, f in hf:                                   # rte_memcpy vn:3064
                for L in range(frame_lines(s.frame)):
                    m.rd(DEV, f + 64 * L, 1, 'data')
            begin = 1 if first else 0                         # vn:464 shadow first
            for i in range(begin, 4):
                m.wr(DEV, s.da(base + i) + 8, 6, 'desc')      # len,id vn:476-477
            for i in range(begin, 4):
                m.wr(DEV, s.da(base + i) + 14, 2, 'desc')     # flags vn:482
            if first:
                s.shadow = base
            first = False
            s.last_avail += 4
        m.wr(DEV, s.da(s.shadow) + 12, 2, 'desc')             # vn:387 id
        m.wr(DEV, s.da(s.shadow) + 14, 2, 'desc')             # vn:389 flags
        s.used += B
        m.rd(DEV, P_DRVEVT + 2, 2, 'event')                   # vh:913/925 driver_event->flags

    def drv_reclaim(s):
        if not s.lazy:
            s.cleanup(B)

    def step(s):
        s.drv_post(); s.dev(); s.drv_reclaim()


# ---------------- packed ring, h2v ---------------------------------------
class PackedRx:
    def __init__(s, m, frame, pf, event_idx, dpdk_2211_11=False):
        s.m, s.frame, s.pf, s.eidx, s.fix = m, frame, pf, event_idx, dpdk_2211_11
        s.avail = 0; s.cons = 0; s.last_avail = 0; s.used = 0; s.bufof = {}; s.nb = 0
        m.wr(DRV, P_DRVEVT, 4, 'event'); m.wr(DEV, P_DEVEVT, 4, 'event')
        s.refill(RING)

    def da(s, i): return P_DESC + 16 * (i % RING)

    def refill(s, n):                          # rx:370 / rx:323
        m = s.m
        for _ in range(n):
            a = s.da(s.avail)
            m.rd(DRV, a + 12, 2, 'desc')                      # did = id rx:385
            k = s.nb % NBUF; s.nb += 1
            s.bufof[s.avail % RING] = buf(k)
            m.wr(DRV, a, 12, 'desc')                          # addr,len rx:330-331
            m.wr(DRV, a + 14, 2, 'desc')                      # flags rx:333
            s.avail += 1

    def dev(s):                                # vn:1522 virtio_dev_rx_packed
        m = s.m
        for g in range(B // 4):
            base = s.last_avail
            m.rd(DEV, s.da(base), 1, 'desc')                  # prefetch vn:1530
            for i in range(4):
                m.rd(DEV, s.da(base + i), 16, 'desc')         # vn:1405,1411,1420,1427
            hf = [s.bufof[(base + i) % RING] for i in range(4)]
            for h, f in hf:
                m.rd(DEV, h, 1, 'hdr')                        # prefetch vn:1449
            if s.fix:                                         # 22.11.11 only
                for h, f in hf:
                    m.assign(DEV, h + 10, 2, 1, 'hdr')
            for h, f in hf:                                   # vn:1457 offload ASSIGNs
                for off, sz in ((6, 2), (8, 2), (0, 1), (1, 1), (4, 2), (2, 2)):
                    m.assign(DEV, h + off, sz, 0, 'hdr')
            for h, f in hf:                                   # rte_memcpy vn:1462
                for L in range(frame_lines(s.frame)):
                    m.wr(DEV, f + 64 * L, min(64, s.frame - 64 * L), 'data')
            for i in range(4):
                m.rd(DEV, s.da(base + i) + 12, 2, 'desc')     # ids vn:1472
            for i in range(4):
                m.wr(DEV, s.da(base + i) + 8, 6, 'desc')      # id,len vn:416-417
            for i in range(4):
                m.wr(DEV, s.da(base + i) + 14, 2, 'desc')     # flags vn:423
            s.last_avail += 4
        s.used += B
        m.rd(DEV, P_DRVEVT + 2, 2, 'event')                   # vh:913/925

    def drv(s):                                # rx:1554 recv_mergeable_pkts_packed
        m = s.m
        got = []
        while s.cons < s.used:                                # rx:126
            a = s.da(s.cons)
            m.rd(DRV, a + 14, 2, 'desc')                      # desc_is_used rx:144
            m.rd(DRV, a + 8, 6, 'desc')                       # len,id rx:146-147
            h, f = s.bufof[s.cons % RING]
            if s.pf:
                m.rd(DRV, f, 1, 'data')                       # rx:155
            got.append(h); s.cons += 1
        for h in got:
            m.rd(DRV, h + 10, 2, 'hdr')                       # rx:1603
        s.refill(len(got))                                    # rx:1696
        m.rd(DRV, P_DEVEVT + 2, 2, 'event')                   # rx:1711

    def step(s):
        s.dev(); s.drv()


def run(cls, *args, warm=64, meas=64, **kw):
    m = Mem()
    p = cls(m, *args, **kw)
    for _ in range(warm):
        p.step()
    m.count = True
    for _ in range(meas):
        p.step()
    n = meas * B
    return {k: v / n for k, v in m.stats.items()}


def fmt(res):
    tot = collections.Counter()
    out = []
    for (a, op, tag), v in sorted(res.items()):
        out.append(f"  {a:3s} {op:6s} {tag:10s} {v:.4f}")
        tot[a] += v
    out.append(f"  TOTAL dev={tot[DEV]:.4f} drv={tot[DRV]:.4f} all={tot[DEV]+tot[DRV]:.4f}")
    return "\n".join(out), tot


if __name__ == '__main__':
    for fr in (64, 1500):
        fl = frame_lines(fr)
        for eidx in (True, False):
            cases = [
                ('split v2h model(full frame write, per-batch reclaim)', SplitTx, (fr, fl, False, eidx)),
                ('split v2h dpdk(txonly 1 line, lazy reclaim rx:1866)', SplitTx, (fr, 1, True, eidx)),
                ('split v2h full frame + lazy reclaim', SplitTx, (fr, fl, True, eidx)),
                ('split h2v model(no data prefetch)', SplitRx, (fr, False, eidx)),
                ('split h2v dpdk(prefetch1 first data line rx:193)', SplitRx, (fr, True, eidx)),
                ('packed v2h model(full frame, per-batch reclaim)', PackedTx, (fr, fl, False, eidx)),
                ('packed v2h dpdk(txonly 1 line, lazy reclaim rx:1784)', PackedTx, (fr, 1, True, eidx)),
                ('packed h2v model', PackedRx, (fr, False, eidx)),
                ('packed h2v dpdk(prefetch1)', PackedRx, (fr, True, eidx)),
                ('packed h2v 22.11.11 (num_buffers ASSIGN)', PackedRx, (fr, False, eidx, True)),
            ]
            for name, cls, args in cases:
                s, tot = fmt(run(cls, *args))
                print(f"== frame={fr} EVENT_IDX={eidx} {name}\n{s}")


def ablation():
    """Quantify ASSIGN_UNLESS_EQUAL-style savings: make every conditional
    store unconditional (per tag) and report the delta."""
    orig = Mem.assign
    for tags in (('avail_ent',), ('hdr',)):
        def assign(self, a, addr, size, val, tag, _t=tags):
            if tag in _t:
                self.rd(a, addr, size, tag)
                self.wr(a, addr, size, tag)
                self.vals[addr] = val
            else:
                orig(self, a, addr, size, val, tag)
        Mem.assign = assign
        for name, cls, args in (('split v2h 64', SplitTx, (64, 1, False, True)),
                                ('split h2v 64', SplitRx, (64, False, True)),
                                ('packed v2h 64', PackedTx, (64, 1, False, True)),
                                ('packed h2v 64 (22.11.11)', PackedRx, (64, False, True, True))):
            s, _tot = fmt({k: v for k, v in run(cls, *args).items() if k[2] in tags})
            print(f"== unconditional {tags} {name}\n{s}")
        Mem.assign = orig
