//! virtio-net, above the rings: the header every packet carries, its length from the
//! negotiated features, and the software fallbacks for offloads a receiver did not take.
//!
//! * `hdr`: `virtio_net_hdr` / `virtio_net_hdr_v1` ([`VnetHdr`]) and [`hdr_len`];
//! * [`offload`]: checksum completion and segmentation (TSO, USO) in software;
//! * [`ecn`]: Congestion Experienced set in place of a drop;
//! * [`features`]: the virtio-net feature bits;
//! * `queue`: which queue index is which pair's receive or transmit queue ([`QueueIndex`]).
//!
//! `hdr` and `queue` are private: what they define is re-exported here.
//!
//! Pure: no syscalls, no unsafe code, nothing panics on input from a peer.

#![forbid(unsafe_code)]

pub mod ecn;
pub mod features;
mod hdr;
pub mod offload;
mod queue;

pub use hdr::{hdr_len, VnetHdr, HDR_LEN, HDR_LEN_LEGACY, NUM_BUFFERS_OFF};
pub use queue::QueueIndex;
