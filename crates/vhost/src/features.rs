//! Feature bits pvnet's virtio-net device and driver use (virtio 1.x, 5.1.3 and 6): the
//! virtio-net ones from [`pvnet_net::features`], the transport and vhost-user ones here.

pub use pvnet_net::features::*;

/// Indirect descriptors.
pub const VIRTIO_F_INDIRECT_DESC: u64 = 1 << 28;
/// used_event / avail_event.
pub const VIRTIO_F_EVENT_IDX: u64 = 1 << 29;
/// vhost-user: protocol features are negotiated.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// The device uses buffers in the order they were made available (virtio 1.x 2.7.9).
/// pvnet's device always does: every path completes chains in pop order and gives back
/// (`unpop`) only a tail it did not take. Drivers that know it (DPDK virtio-user) take a
/// cheaper path; the used ring is still written entry by entry.
pub const VIRTIO_F_IN_ORDER: u64 = 1 << 35;

/// The packed virtqueue (virtio 1.1+, 2.8).
pub const VIRTIO_F_RING_PACKED: u64 = 1 << 34;

/// The device reaches memory only through the platform's IOMMU (virtio 1.x 6; formerly
/// `VIRTIO_F_IOMMU_PLATFORM`): over vhost-user, every ring address is an IOVA translated by
/// the IOTLB the frontend fills (`iotlb`).
pub const VIRTIO_F_ACCESS_PLATFORM: u64 = 1 << 33;

/// vhost: the device marks the pages it writes in the dirty log (live migration; vhost-user
/// with `VHOST_USER_PROTOCOL_F_LOG_SHMFD`).
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;

/// What pvnet's device offers.
pub const DEVICE_FEATURES: u64 = VIRTIO_F_VERSION_1
    | VIRTIO_F_RING_PACKED
    | VIRTIO_F_IN_ORDER
    | VIRTIO_F_EVENT_IDX
    | VIRTIO_NET_F_MRG_RXBUF
    | VIRTIO_F_INDIRECT_DESC
    | VIRTIO_F_ACCESS_PLATFORM
    | VHOST_F_LOG_ALL
    | VHOST_USER_F_PROTOCOL_FEATURES;

/// Checksum and TSO offloads in both directions (5.1.6.2, 5.1.6.4). Offered by `pvnet switch`,
/// which completes checksums and segments in software for a receiver that did not take them.
pub const OFFLOAD_FEATURES: u64 = VIRTIO_NET_F_CSUM
    | VIRTIO_NET_F_GUEST_CSUM
    | VIRTIO_NET_F_GUEST_TSO4
    | VIRTIO_NET_F_GUEST_TSO6
    | VIRTIO_NET_F_GUEST_ECN
    | VIRTIO_NET_F_HOST_TSO4
    | VIRTIO_NET_F_HOST_TSO6
    | VIRTIO_NET_F_HOST_ECN;

/// Queue index of the first receive queue (device writes) in a virtio-net device.
pub const RX_QUEUE: usize = 0;
/// Queue index of the first transmit queue (device reads).
pub const TX_QUEUE: usize = 1;
