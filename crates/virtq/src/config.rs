//! The vocabulary every ring format shares: the format, the direction of a queue's buffers,
//! the ring addresses and the address space they are in, the configuration a queue starts
//! from, a buffer the driver adds, the largest queue size, and what an access needs of the
//! memory it touches ([`Perm`]: the translation seam and the errors both name it).
//!
//! The bottom of the crate: this module imports none of the crate's other modules; the
//! formats ([`crate::split`], [`crate::packed`]) and the facade over them ([`crate::queue`])
//! build on it.

/// A ring format (virtio 1.x 2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// The split virtqueue (2.7): descriptor table, avail ring, used ring.
    #[default]
    Split,
    /// The packed virtqueue (2.8): one descriptor ring, two event suppression areas.
    Packed,
}

impl Format {
    /// Every format this build implements (the format tests run each).
    pub const ALL: &'static [Format] = &[Format::Split, Format::Packed];

    /// The base of a queue that starts fresh (vhost-user's encoding: the packed ring carries
    /// its wrap counter, 1 at start, in bit 15).
    pub fn fresh_base(self) -> u16 {
        match self {
            Format::Split => 0,
            Format::Packed => 0x8000,
        }
    }
}

/// Which way data moves in a queue's buffers, as the device sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Only device-readable buffers (a transmit queue).
    DeviceReads,
    /// Only device-writable buffers (a receive queue).
    DeviceWrites,
    /// Readable descriptors followed by writable ones (a control queue).
    Mixed,
}

/// The three ring addresses as the peer gave them (split: descriptor table, avail ring,
/// used ring; packed: descriptor ring, driver event area, device event area).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingAddrs {
    /// Descriptor table.
    pub desc: u64,
    /// Driver (available) ring.
    pub avail: u64,
    /// Device (used) ring.
    pub used: u64,
}

/// Everything needed to start a queue, in either role.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// The ring format.
    pub format: Format,
    /// Number of descriptors: a power of two, 1..=32768.
    pub size: u16,
    /// Ring addresses.
    pub addrs: RingAddrs,
    /// The space `addrs` are in (vhost-user uses the frontend's user addresses).
    pub space: AddrSpace,
    /// First avail index to consume (vhost-user `SET_VRING_BASE`; packed: the slot in bits
    /// 0-14 and the wrap counter in bit 15, see [`Format::fresh_base`]).
    pub base: u16,
    /// `VIRTIO_F_EVENT_IDX` negotiated.
    pub event_idx: bool,
    /// `VIRTIO_F_INDIRECT_DESC` negotiated.
    pub indirect: bool,
    /// `VIRTIO_F_IN_ORDER` negotiated: the device may return a batch of buffers with one
    /// used entry (the packed ring does so on queues the device only reads).
    pub in_order: bool,
    /// Expected buffer direction.
    pub direction: Direction,
}

/// Address space of an address the peer gave us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrSpace {
    /// Guest physical address (descriptor addresses; IOVA when a vIOMMU is on).
    Guest,
    /// The frontend's own virtual address (vhost-user `SET_VRING_ADDR`).
    User,
}

/// One buffer of a chain the driver adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Guest address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// The device writes it.
    pub write: bool,
}

/// Largest queue size, of either format (2.7: "Queue Size ... maximum 32768"; the packed
/// ring takes the same bound).
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// What an access needs from the memory behind an address.
///
/// The values are the vhost IOTLB's access bits (`VHOST_ACCESS_RO` 1, `_WO` 2, `_RW` 3), so a
/// check is one AND and one compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Perm {
    /// The device reads (a transmit buffer, a descriptor table, the avail ring).
    Read = 1,
    /// The device writes (a receive buffer).
    Write = 2,
    /// Both (the used ring, whose flags the device writes and whose event it reads).
    ReadWrite = 3,
}

impl Perm {
    /// Whether a grant of `self` allows an access needing `need`.
    #[inline]
    pub fn allows(self, need: Perm) -> bool {
        self as u8 & need as u8 == need as u8
    }

    /// From the vhost IOTLB's access bits; `None` for 0 (no access) or unknown bits.
    pub fn from_bits(bits: u8) -> Option<Perm> {
        match bits {
            1 => Some(Perm::Read),
            2 => Some(Perm::Write),
            3 => Some(Perm::ReadWrite),
            _ => None,
        }
    }
}
