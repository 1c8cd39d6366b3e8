//! Errors: every rule a peer can break, with the values that broke it.

/// A violation of the virtqueue contract by the peer, or a bad configuration.
///
/// The message of each variant is the text that is logged when the queue stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The avail index moved further than the queue size since we last consumed.
    #[error("avail index jumped from {last} to {idx}, more than the queue size {size}")]
    AvailIdxJump { last: u16, idx: u16, size: u16 },
    /// A descriptor index (head or `next`) is outside the table.
    #[error("descriptor index {index} out of range (table of {size})")]
    DescIndexOutOfRange { index: u16, size: u16 },
    /// The chain has more descriptors than the queue (or indirect table) allows: too long or a loop.
    #[error("descriptor chain longer than {max} (loop or overlong chain)")]
    ChainTooLong { max: u32 },
    /// Adding a descriptor's length overflows the chain's total.
    #[error("descriptor chain length overflows u32")]
    LenOverflow,
    /// A buffer address range is not inside the memory the peer shared.
    #[error("address {addr:#x}+{len:#x} is not in any shared memory region")]
    AddrNotMapped { addr: u64, len: u64 },
    /// A device-readable descriptor follows a device-writable one (virtio 1.x 2.7.4.2).
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// A writable descriptor on a queue the device only reads, or a readable one on a queue it only writes.
    #[error("descriptor direction mismatch: {found} descriptor on a {queue} queue")]
    DirectionMismatch {
        found: &'static str,
        queue: &'static str,
    },
    /// VIRTQ_DESC_F_INDIRECT used without VIRTIO_F_INDIRECT_DESC negotiated.
    #[error("indirect descriptor but VIRTIO_F_INDIRECT_DESC not negotiated")]
    IndirectNotNegotiated,
    /// An indirect descriptor inside an indirect table, or with F_NEXT set (2.7.5.3.1).
    #[error("indirect descriptor nested or chained with F_NEXT")]
    IndirectNested,
    /// The indirect table length is zero, not a multiple of 16, or larger than allowed.
    #[error("indirect table length {len} invalid")]
    IndirectBadLen { len: u32 },
    /// The device reported a used id that is out of range or not in flight.
    #[error("used id {id} is not a buffer in flight")]
    UsedIdInvalid { id: u32 },
    /// The device reported writing more bytes than the buffer holds.
    #[error("used len {len} larger than the {cap} writable bytes of buffer {id}")]
    UsedLenTooBig { id: u16, len: u32, cap: u32 },
    /// The used index moved further than the number of buffers in flight.
    #[error("used index jumped from {last} to {idx} with only {in_flight} buffers in flight")]
    UsedIdxJump { last: u16, idx: u16, in_flight: u16 },
    /// Queue size is zero, not a power of two, or above 32768.
    #[error("queue size {0} invalid (power of two, 1..=32768)")]
    BadQueueSize(u32),
    /// A ring address is misaligned for its part (desc 16, avail 2, used 4).
    #[error("{part} ring address {addr:#x} misaligned")]
    RingMisaligned { part: &'static str, addr: u64 },
    /// Memory regions overlap or wrap the address space.
    #[error("memory region {index} invalid: {why}")]
    BadRegion { index: usize, why: &'static str },
    /// A receive buffer too small for what must go first in it (the virtio-net header).
    #[error("receive buffer of {len} bytes cannot hold the {need}-byte header")]
    BufferTooSmall { len: u32, need: u32 },
    /// The shared memory behind the queue became inaccessible (the peer truncated its file).
    #[error("shared memory fault: the peer shrank or revoked the memory it shared")]
    MemoryFault,
    /// A packed-ring chain continues into a slot that is not available (the driver must make
    /// a chain's head available last).
    #[error("descriptor {index} of a chain is not available")]
    DescNotAvailable { index: u16 },
    /// The driver has no free descriptors for this buffer.
    #[error("no free descriptors")]
    NoFreeDescriptors,
    /// A translator that caches grants (an IOTLB) has no translation for the range yet: the
    /// queue consumed nothing and tries again once the translation arrives. Not a violation.
    #[error("no translation yet for {addr:#x}+{len:#x} ({perm:?}): waiting for the peer")]
    TranslationMiss {
        addr: u64,
        len: u64,
        perm: crate::config::Perm,
    },
    /// The peer granted the range, but not for this access (a write into a read-only grant):
    /// refused, never retried.
    #[error("access to {addr:#x}+{len:#x} ({perm:?}) not allowed by its grant")]
    AccessDenied {
        addr: u64,
        len: u64,
        perm: crate::config::Perm,
    },
    /// A queue waited for a translation the peer never granted (an IOTLB miss unanswered).
    #[error("no translation for {addr:#x} after {waited_ms} ms: the peer did not answer the miss")]
    IotlbMissUnanswered { addr: u64, waited_ms: u32 },
    /// The peer revoked the grant of a running ring's own memory.
    #[error("ring memory {addr:#x}+{len:#x} revoked while the queue runs")]
    RingRevoked { addr: u64, len: u64 },
}

impl Error {
    /// Whether the queue may go on (nothing was consumed; retry later) rather than stop.
    #[inline]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::TranslationMiss { .. })
    }
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, Error>;
