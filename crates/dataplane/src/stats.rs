//! Per-port counters. The worker is the only writer; it adds once per batch (never per
//! packet) with relaxed stores; readers (progress, the final report) read relaxed snapshots.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a packet was dropped. Every packet that enters is delivered or counted here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The destination had no receive buffer and the packet could not wait.
    NoBuffer = 0,
    /// The destination port is not connected (or its queue is not running).
    PortDown = 1,
    /// Malformed: shorter than the virtio-net header.
    Invalid = 2,
    /// Larger than the receiver's buffers can take (without mergeable buffers: one chain).
    TooBig = 3,
    /// Switch: addressed to a station on the port it came from (a bridge never sends a frame
    /// back where it came from).
    Filtered = 4,
    /// Switch: offload metadata the receiver cannot take and pvnet cannot resolve in software
    /// (UFO, a malformed GSO header), or the kernel refused the frame (tap).
    Offload = 5,
    /// Egress queue: full (its packet limit or its memory); fq_codel drops from the flow
    /// with the most bytes waiting.
    QueueLimit = 6,
    /// Egress queue: dropped by CoDel (the flow's packets waited longer than its target for
    /// an interval).
    Aqm = 7,
    /// Egress queue: emptied because its settings were changed while packets waited
    /// (`pvnet ctl port set`), as `tc qdisc replace` drops what the old qdisc held.
    Reconfigured = 8,
    /// Switch: in a VLAN the port it came in on does not carry (a tagged frame on an access
    /// port, a VLAN not in a trunk's list, an untagged frame on a trunk with no native VLAN),
    /// or, sent to a port, in a VLAN that port does not carry.
    VlanFiltered = 9,
}

impl DropReason {
    /// All reasons, in counter order.
    pub const ALL: [DropReason; 10] = [
        DropReason::NoBuffer,
        DropReason::PortDown,
        DropReason::Invalid,
        DropReason::TooBig,
        DropReason::Filtered,
        DropReason::Offload,
        DropReason::QueueLimit,
        DropReason::Aqm,
        DropReason::Reconfigured,
        DropReason::VlanFiltered,
    ];

    /// Stable name for reports.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::NoBuffer => "no_buffer",
            DropReason::PortDown => "port_down",
            DropReason::Invalid => "invalid",
            DropReason::TooBig => "too_big",
            DropReason::Filtered => "filtered",
            DropReason::Offload => "offload",
            DropReason::QueueLimit => "queue_limit",
            DropReason::Aqm => "aqm",
            DropReason::Reconfigured => "reconfigured",
            DropReason::VlanFiltered => "vlan_filtered",
        }
    }
}

/// Counters of one port. "rx" is what the port received from its frontend (the frontend's
/// TX queue), "tx" what it delivered to the frontend (its RX queue).
#[derive(Debug, Default)]
pub struct PortStats {
    /// Packets taken from the frontend.
    pub rx_packets: AtomicU64,
    /// Bytes taken from the frontend (virtio-net header excluded).
    pub rx_bytes: AtomicU64,
    /// Packets delivered to the frontend.
    pub tx_packets: AtomicU64,
    /// Bytes delivered to the frontend.
    pub tx_bytes: AtomicU64,
    /// Drops decided at this port, by reason: of packets that entered here, and of packets
    /// that waited in its egress queue (`queue_limit`, `aqm`; `no_buffer` or `port_down` when
    /// a queue that could not drain is emptied).
    pub drops: [AtomicU64; DropReason::ALL.len()],
    /// Kicks received (eventfd counts drained).
    pub kicks: AtomicU64,
    /// Calls (interrupts) sent.
    pub calls: AtomicU64,
    /// Batches taken from the frontend's transmit ring (used->idx publishes): rx_packets /
    /// rx_batches is the batch size the frontend's pace allowed.
    pub rx_batches: AtomicU64,
    /// Batches delivered into the frontend's receive ring (used->idx publishes).
    pub tx_batches: AtomicU64,
    /// Times the worker slept with this port armed.
    pub sleeps: AtomicU64,
    /// Queues stopped for a virtqueue violation.
    pub queue_errors: AtomicU64,
    /// Indirect-table entries of the frontend's transmit ring whose write flag was ignored
    /// (the device only reads that ring; DPDK's packed multi-segment packets carry the flag on
    /// their header entry): tolerated, not an error.
    pub write_flags_ignored: AtomicU64,
    /// IOTLB: translations the queues found missing and asked the frontend for (MISS).
    pub iotlb_misses: AtomicU64,
    /// IOTLB: times a running ring's own translation was invalidated (a vIOMMU's domain-wide
    /// flush) and the ring was parked, untouched, until granted again.
    pub rings_parked: AtomicU64,
    /// Live migration: receive buffers delivered while the dirty log was on (their pages,
    /// and the used ring's, marked for the frontend to copy again).
    pub dirty_logged: AtomicU64,
    /// Sink: data frames out of order or missing.
    pub seq_errors: AtomicU64,
    /// Sink: count carried by the end marker + 1 (0 = none seen yet).
    pub end_marker: AtomicU64,
    /// Switch: packets from this port flooded (broadcast, multicast, unknown unicast).
    pub flooded: AtomicU64,
    /// Switch: packets segmented in software for this port (it cannot take GSO).
    pub sw_gso: AtomicU64,
    /// Switch: checksums completed in software for this port (it cannot take partial ones).
    pub sw_csum: AtomicU64,
    /// Egress queue: packets copied in (they found no room, or others waited before them).
    pub queued: AtomicU64,
    /// Egress queue: packets delivered from it.
    pub dequeued: AtomicU64,
    /// Egress queue: drains that delivered something (dequeued / dequeues = packets per
    /// dequeue).
    pub dequeues: AtomicU64,
    /// Egress queue: packets waiting now (a gauge).
    pub backlog: AtomicU64,
    /// Egress queue: packets CoDel marked Congestion Experienced instead of dropping them
    /// (their senders declared ECN-capable transport) and sent.
    pub ecn_marked: AtomicU64,
    /// The device queue's dynamic limit, in buffers (a gauge; 0: none kept).
    pub dql_limit: AtomicU64,
    /// Publishes that found the receiver asleep on an empty ring while the limit had held
    /// packets back for it (starved by the limit: each raises the limit's ceiling, see the
    /// egress module's `pace`).
    pub dql_idle: AtomicU64,
    /// Trials of the reserve those starvations bring (with `dql_witness`): the receiver's
    /// rate measured with it, then without it (the egress module's `pace`).
    pub dql_trials: AtomicU64,
    /// Trials whose reserve bought the receiver rate, and was kept.
    pub dql_kept: AtomicU64,
    /// Tap: syscalls made to move packets (`read`, `writev`, `io_uring_enter`).
    pub syscalls: AtomicU64,
    /// Kernel port: packets the kernel wrote straight into a frontend's receive buffers
    /// (direct receive: the hop's only copy). The rest of `rx_packets` were read into the
    /// port's own buffers and copied once more.
    pub rx_direct: AtomicU64,
    /// Kernel port: packets the kernel dropped on their way to pvnet since the port opened (a
    /// tap's queue for its reader full: the interface's `tx_dropped`; an `AF_PACKET` socket's
    /// receive queue full: `tp_drops`; an `AF_XDP` socket's fill ring empty or receive ring
    /// full: `XDP_STATISTICS`), read about once a second. Not in `drops_*`: pvnet never had
    /// them.
    pub kernel_drops: AtomicU64,
    /// A frontend is attached (vhost-user) or the port is open (tap, sink, gen): 1, else 0.
    pub up: AtomicU64,
    /// Why its last queue was stopped (the rule the peer broke), for logs and `pvnet ctl`.
    /// Written only when a queue stops: never on the packet path.
    pub last_error: std::sync::Mutex<Option<String>>,
    /// The bound on the warnings this port's peers can cause (queues stopped, rings left
    /// idle), across reconnections. Touched only when such a line is written.
    pub log: pvnet_vhost::PeerLog,
}

/// Adds `n` to a counter only the caller writes.
#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    if n != 0 {
        // Relaxed: a statistic; single writer, so load+store cannot lose an update.
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

/// A plain copy of [`PortStats`] for reports.
#[derive(Debug, Default, Clone, serde::Serialize, PartialEq, Eq)]
pub struct PortSnapshot {
    /// Port id.
    pub port: u32,
    /// See [`PortStats`].
    pub rx_packets: u64,
    /// See [`PortStats`].
    pub rx_bytes: u64,
    /// See [`PortStats`].
    pub tx_packets: u64,
    /// See [`PortStats`].
    pub tx_bytes: u64,
    /// Drops by reason name.
    pub drops: std::collections::BTreeMap<&'static str, u64>,
    /// See [`PortStats`].
    pub kicks: u64,
    /// See [`PortStats`].
    pub calls: u64,
    /// See [`PortStats`].
    pub rx_batches: u64,
    /// See [`PortStats`].
    pub tx_batches: u64,
    /// See [`PortStats`].
    pub sleeps: u64,
    /// See [`PortStats`].
    pub queue_errors: u64,
    /// See [`PortStats::write_flags_ignored`].
    pub write_flags_ignored: u64,
    /// See [`PortStats`].
    pub iotlb_misses: u64,
    /// See [`PortStats`].
    pub rings_parked: u64,
    /// See [`PortStats`].
    pub dirty_logged: u64,
    /// See [`PortStats`].
    pub seq_errors: u64,
    /// End marker count, if one arrived.
    pub end_marker: Option<u64>,
    /// See [`PortStats`].
    pub flooded: u64,
    /// See [`PortStats`].
    pub sw_gso: u64,
    /// See [`PortStats`].
    pub sw_csum: u64,
    /// See [`PortStats`].
    pub queued: u64,
    /// See [`PortStats`].
    pub dequeued: u64,
    /// See [`PortStats`].
    pub dequeues: u64,
    /// See [`PortStats`].
    pub backlog: u64,
    /// See [`PortStats`].
    pub ecn_marked: u64,
    /// See [`PortStats`].
    pub dql_limit: u64,
    /// See [`PortStats`].
    pub dql_idle: u64,
    /// See [`PortStats`].
    pub dql_trials: u64,
    /// See [`PortStats`].
    pub dql_kept: u64,
    /// See [`PortStats`].
    pub syscalls: u64,
    /// See [`PortStats`].
    pub rx_direct: u64,
    /// See [`PortStats`].
    pub kernel_drops: u64,
    /// See [`PortStats`].
    pub up: bool,
    /// Why a queue of the port was last stopped, if one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Each queue pair's own traffic, when the port has more than one (index = pair).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueSnapshot>,
}

/// One queue pair's traffic (multiqueue ports): what its transmit ring carried in (`rx_*`)
/// and its receive ring out (`tx_*`), as the port counts them.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, PartialEq, Eq)]
pub struct QueueSnapshot {
    /// See [`PortStats`].
    pub rx_packets: u64,
    /// See [`PortStats`].
    pub rx_bytes: u64,
    /// See [`PortStats`].
    pub tx_packets: u64,
    /// See [`PortStats`].
    pub tx_bytes: u64,
    /// Packets dropped, every reason.
    pub drops: u64,
    /// See [`PortStats`].
    pub kicks: u64,
    /// See [`PortStats`].
    pub calls: u64,
}

impl From<&PortSnapshot> for QueueSnapshot {
    fn from(s: &PortSnapshot) -> Self {
        Self {
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            drops: s.drops.values().sum(),
            kicks: s.kicks,
            calls: s.calls,
        }
    }
}

impl PortSnapshot {
    /// The snapshot of a port whose counters are kept per queue pair: their sum (an end
    /// marker: the largest seen; up: any pair), and each pair's traffic if there are several.
    pub(crate) fn sum<'a>(port: u32, qps: impl IntoIterator<Item = &'a PortStats>) -> Self {
        let mut t = PortSnapshot {
            port,
            ..PortSnapshot::default()
        };
        let mut queues = Vec::new();
        for (k, s) in qps.into_iter().enumerate() {
            let s = s.snapshot(port);
            queues.push(QueueSnapshot::from(&s));
            if k == 0 {
                t = s;
                continue;
            }
            t.rx_packets += s.rx_packets;
            t.rx_bytes += s.rx_bytes;
            t.tx_packets += s.tx_packets;
            t.tx_bytes += s.tx_bytes;
            for (name, n) in s.drops {
                *t.drops.entry(name).or_default() += n;
            }
            t.kicks += s.kicks;
            t.calls += s.calls;
            t.rx_batches += s.rx_batches;
            t.tx_batches += s.tx_batches;
            t.sleeps += s.sleeps;
            t.queue_errors += s.queue_errors;
            t.write_flags_ignored += s.write_flags_ignored;
            t.iotlb_misses += s.iotlb_misses;
            t.rings_parked += s.rings_parked;
            t.dirty_logged += s.dirty_logged;
            t.seq_errors += s.seq_errors;
            t.end_marker = t.end_marker.max(s.end_marker);
            t.flooded += s.flooded;
            t.sw_gso += s.sw_gso;
            t.sw_csum += s.sw_csum;
            t.queued += s.queued;
            t.dequeued += s.dequeued;
            t.dequeues += s.dequeues;
            t.backlog += s.backlog;
            t.ecn_marked += s.ecn_marked;
            t.dql_limit = t.dql_limit.max(s.dql_limit);
            t.dql_idle += s.dql_idle;
            t.dql_trials += s.dql_trials;
            t.dql_kept += s.dql_kept;
            t.syscalls += s.syscalls;
            t.rx_direct += s.rx_direct;
            t.kernel_drops += s.kernel_drops;
            t.up |= s.up;
            t.last_error = t.last_error.or(s.last_error);
        }
        if queues.len() > 1 {
            t.queues = queues;
        }
        t
    }
}

impl PortStats {
    /// Snapshot for port `port`.
    pub(crate) fn snapshot(&self, port: u32) -> PortSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let end = r(&self.end_marker);
        PortSnapshot {
            port,
            rx_packets: r(&self.rx_packets),
            rx_bytes: r(&self.rx_bytes),
            tx_packets: r(&self.tx_packets),
            tx_bytes: r(&self.tx_bytes),
            drops: DropReason::ALL
                .iter()
                .map(|&d| (d.name(), r(&self.drops[d as usize])))
                .collect(),
            kicks: r(&self.kicks),
            calls: r(&self.calls),
            rx_batches: r(&self.rx_batches),
            tx_batches: r(&self.tx_batches),
            sleeps: r(&self.sleeps),
            queue_errors: r(&self.queue_errors),
            write_flags_ignored: r(&self.write_flags_ignored),
            iotlb_misses: r(&self.iotlb_misses),
            rings_parked: r(&self.rings_parked),
            dirty_logged: r(&self.dirty_logged),
            seq_errors: r(&self.seq_errors),
            end_marker: end.checked_sub(1),
            flooded: r(&self.flooded),
            sw_gso: r(&self.sw_gso),
            sw_csum: r(&self.sw_csum),
            queued: r(&self.queued),
            dequeued: r(&self.dequeued),
            dequeues: r(&self.dequeues),
            backlog: r(&self.backlog),
            ecn_marked: r(&self.ecn_marked),
            dql_limit: r(&self.dql_limit),
            dql_idle: r(&self.dql_idle),
            dql_trials: r(&self.dql_trials),
            dql_kept: r(&self.dql_kept),
            syscalls: r(&self.syscalls),
            rx_direct: r(&self.rx_direct),
            kernel_drops: r(&self.kernel_drops),
            up: r(&self.up) != 0,
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            queues: Vec::new(),
        }
    }
}
