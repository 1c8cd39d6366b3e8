//! A parsed, validated descriptor chain, whatever ring format it came from.

/// One parsed, validated descriptor chain. Its segments are in the queue's scratch space
/// (read them with the queue's `readable` / `writable`) until the next batch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    /// The id to return in the used ring (split: the head descriptor index; packed: the
    /// buffer id of the chain's last descriptor).
    pub head: u16,
    /// Total device-readable bytes.
    pub readable: u32,
    /// Total device-writable bytes.
    pub writable: u32,
    /// First segment in the queue's scratch.
    pub(crate) start: u32,
    /// Readable segments (they come first).
    pub(crate) nread: u32,
    /// All segments.
    pub(crate) nsegs: u32,
}
