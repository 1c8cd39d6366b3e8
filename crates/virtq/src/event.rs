//! Notification suppression arithmetic (virtio 1.x 2.7.7 and 2.7.10, `VIRTIO_F_EVENT_IDX`).

/// Whether moving an index from `old` to `new` crosses `event`, i.e. the peer asked to be
/// notified when the index passes `event` (the Linux `vring_need_event`).
///
/// All arithmetic is modulo 2^16: indices are free-running 16-bit counters.
#[inline]
#[must_use]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Result of arming notifications: the one function that does "arm, fence, re-check".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a ring that is not empty after arming must be processed before sleeping"]
pub enum Armed {
    /// Notifications are on and the ring was empty after the fence: safe to sleep.
    Empty,
    /// Work arrived while arming: process it, do not sleep.
    NotEmpty,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crosses_exactly_once() {
        // event at 5: moving 3 -> 6 crosses it (5 is in (3, 6]), 6 -> 9 does not.
        assert!(need_event(5, 6, 3));
        assert!(!need_event(5, 9, 6));
        assert!(need_event(5, 6, 5)); // new == event + 1, old == event
        assert!(!need_event(5, 5, 4)); // reaching event itself is not passing it
    }

    #[test]
    fn wraps_at_16_bits() {
        assert!(need_event(0xffff, 0x0001, 0xfffe));
        assert!(need_event(0x0000, 0x0002, 0xffff));
        assert!(!need_event(0x0003, 0x0002, 0xffff));
        // A stale event far behind fires only when the counter comes round again.
        assert!(!need_event(0x1000, 0x9000, 0x8f00));
    }

    #[test]
    fn no_movement_never_notifies() {
        for e in [0u16, 1, 0x7fff, 0xffff] {
            for i in [0u16, 1, 0x8000, 0xffff] {
                assert!(!need_event(e, i, i));
            }
        }
    }
}
