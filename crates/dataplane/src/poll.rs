//! The clock and the polling window.
//!
//! After a batch finds no work the worker keeps polling for a window bounded in time before
//! it arms notifications and sleeps. A sleep/wake through an eventfd costs tens of
//! microseconds on these machines, a poll of an empty ring a cache miss: polling a little
//! while is far cheaper than a kick per packet when the peer is slower than us (the "backend
//! too fast" regime). The window is fixed here; time is injected so the policy can be tested.

use std::time::{Duration, Instant};

/// A source of time (injected, so polling policies are testable).
pub trait Clock {
    /// Now.
    fn now(&self) -> Instant;
}

/// The real monotonic clock (vDSO `clock_gettime`, no syscall).
#[derive(Debug, Default, Clone, Copy)]
pub struct MonoClock;

impl Clock for MonoClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Default window: a few times the measured cost of one eventfd wake-up here (~30 us),
/// short enough that an idle port stops spinning at once on the human scale.
pub const DEFAULT_WINDOW: Duration = Duration::from_micros(100);

/// Decides, after each empty poll, whether to keep polling or to arm and sleep.
#[derive(Debug, Clone, Copy)]
pub struct PollWindow {
    window: Duration,
    idle_since: Option<Instant>,
}

impl PollWindow {
    /// A window of `window` (zero: arm as soon as the rings are empty).
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            idle_since: None,
        }
    }

    /// Work was found: the window starts again at the next empty poll.
    #[inline]
    pub fn work(&mut self) {
        self.idle_since = None;
    }

    /// No work this round: true to keep polling, false to arm and sleep.
    #[inline]
    pub fn keep_polling(&mut self, clock: &impl Clock) -> bool {
        let now = clock.now();
        match self.idle_since {
            None => {
                self.idle_since = Some(now);
                !self.window.is_zero()
            }
            Some(t) => now.duration_since(t) < self.window,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    struct Fake(Cell<Instant>);
    impl Clock for Fake {
        fn now(&self) -> Instant {
            self.0.get()
        }
    }

    #[test]
    fn window_is_bounded_in_time_and_restarts_on_work() {
        let c = Fake(Cell::new(Instant::now()));
        let mut w = PollWindow::new(Duration::from_micros(50));
        assert!(w.keep_polling(&c));
        c.0.set(c.0.get() + Duration::from_micros(49));
        assert!(w.keep_polling(&c));
        c.0.set(c.0.get() + Duration::from_micros(1));
        assert!(!w.keep_polling(&c), "window over: arm and sleep");
        w.work();
        assert!(w.keep_polling(&c), "work restarts the window");
        let mut z = PollWindow::new(Duration::ZERO);
        assert!(!z.keep_polling(&c), "zero window arms at once");
    }
}
