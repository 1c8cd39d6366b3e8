//! Loans: a frontend's receive buffers lent to a device that keeps them until frames arrive
//! (an `AF_XDP` socket's fill ring), so that the device's own copy puts each frame where the
//! frontend reads it (direct receive across rounds, docs/afxdp.md).
//!
//! Unlike the one-look lease of a kernel port's reads ([`super::Lease`]), a loan outlives the
//! round: the chain is popped from the frontend's receive ring when it is lent and completed
//! (a used entry) when the device has written a frame into it, or given back empty when the
//! loan is called in. So only a frontend whose used entries may come out of order lends (not
//! one that negotiated `VIRTIO_F_IN_ORDER`), and the shard calls every loan in before the
//! frontend's ring stops or restarts or its memory changes
//! (`Shard::call_in_loans`): the device must never write into a buffer the frontend took
//! back.

#[cfg(doc)]
use super::vhost::VhostPort;
use super::AnyPort;
use crate::pkt::PortId;
use std::ptr::NonNull;

/// One receive buffer lent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loan {
    /// The port it belongs to.
    pub lender: PortId,
    /// The lender's loan generation when it was lent ([`VhostPort::lender`]): a loan of
    /// another generation is void.
    pub gen: u32,
    /// The queue pair whose receive ring it came from.
    pub pair: u16,
    /// Its chain's id (the used entry's).
    pub head: u16,
    /// Its first byte, where the header goes, in the lender's mapping; the frame goes right
    /// behind the header.
    pub buf: NonNull<u8>,
    /// Bytes behind the header.
    pub room: u32,
}

/// Whether the port a sender's packets all go to lends its receive buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lending {
    /// It lends: its id and loan generation.
    Yes(PortId, u32),
    /// It would, but not now: packets wait in its egress queue for its buffers, and go first.
    Later,
    /// Not at all (no one port, or a frontend that cannot lend).
    No,
}

// SAFETY: a loan is an address and a length in a frontend's shared memory; it moves only
// with the port holding it, within one shard, and is used only while its generation holds.
unsafe impl Send for Loan {}

impl AnyPort {
    /// Whether it lends now ([`VhostPort::lender`]).
    pub(crate) fn lender(&self) -> Lending {
        match self {
            AnyPort::Vhost(p) => p.lender(),
            _ => Lending::No,
        }
    }

    /// The memory its loans lie in ([`VhostPort::loan_memory`]).
    pub(crate) fn loan_memory(&self) -> Vec<pvnet_vhost::View> {
        match self {
            AnyPort::Vhost(p) => p.loan_memory(),
            _ => Vec::new(),
        }
    }

    /// [`VhostPort::loan`].
    pub(crate) fn loan(
        &mut self,
        want: usize,
        room: u32,
        out: &mut dyn FnMut(Loan) -> bool,
    ) -> usize {
        self.as_vhost().map_or(0, |p| p.loan(want, room, out))
    }

    /// [`VhostPort::repay`].
    pub(crate) fn repay(&mut self, l: &Loan, len: u32) -> bool {
        self.as_vhost().is_some_and(|p| p.repay(l, len))
    }

    /// [`VhostPort::unloan`].
    pub(crate) fn unloan(&mut self, loans: &[Loan]) {
        if let Some(p) = self.as_vhost() {
            p.unloan(loans);
        }
    }
}
