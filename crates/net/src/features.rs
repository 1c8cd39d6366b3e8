//! virtio-net feature bits (virtio 1.x, 5.1.3) and the transport bits the header depends on.

/// Device handles packets with partial checksum.
pub const VIRTIO_NET_F_CSUM: u64 = 1 << 0;
/// Driver handles packets with partial checksum.
pub const VIRTIO_NET_F_GUEST_CSUM: u64 = 1 << 1;
/// The device reports its maximum MTU in its config space (`mtu`) and the driver uses it
/// (5.1.3, 5.1.6.3.1); over vhost-user the frontend supplies the value and tells the backend
/// with `VHOST_USER_NET_SET_MTU`.
pub const VIRTIO_NET_F_MTU: u64 = 1 << 3;
/// Device has a MAC in config space.
pub const VIRTIO_NET_F_MAC: u64 = 1 << 5;
/// Driver can receive TSOv4.
pub const VIRTIO_NET_F_GUEST_TSO4: u64 = 1 << 7;
/// Driver can receive TSOv6.
pub const VIRTIO_NET_F_GUEST_TSO6: u64 = 1 << 8;
/// Driver can receive TSO with ECN.
pub const VIRTIO_NET_F_GUEST_ECN: u64 = 1 << 9;
/// Device can receive TSOv4.
pub const VIRTIO_NET_F_HOST_TSO4: u64 = 1 << 11;
/// Device can receive TSOv6.
pub const VIRTIO_NET_F_HOST_TSO6: u64 = 1 << 12;
/// Device can receive TSO with ECN.
pub const VIRTIO_NET_F_HOST_ECN: u64 = 1 << 13;
/// Driver can merge receive buffers.
pub const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
/// Several receive/transmit queue pairs, and the control queue's `VQ_PAIRS_SET` (5.1.6.5.5).
/// Over vhost-user the frontend keeps the control queue and enables the pairs the driver
/// chose with `SET_VRING_ENABLE`.
pub const VIRTIO_NET_F_MQ: u64 = 1 << 22;
/// Virtio 1.x (modern) device.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
