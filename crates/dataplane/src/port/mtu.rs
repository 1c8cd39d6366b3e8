//! An interface's MTU, followed while its port runs: `ip link set dev X mtu N` on a running
//! tap, `AF_PACKET` or `AF_XDP` port takes effect within a second, with no port re-added.
//!
//! The switch checks each packet against its receiver's MTU ([`crate::pkt::fits_mtu`]), so a
//! stale MTU either drops frames the interface would now take (`too_big`) or hands it frames
//! it would refuse. Reading the MTU is a syscall (`SIOCGIFMTU`), so it is read when the port
//! opens and again at most once a second, from the port's transmit and idle hooks: never per
//! packet.

use crate::pkt::PortId;
use crate::poll::Every;
use std::time::{Duration, Instant};

/// The MTU of an interface a port sends to.
#[derive(Debug)]
pub(crate) struct MtuWatch {
    ifname: String,
    /// The most the port's buffers carry: a larger MTU is taken as this.
    most: u32,
    mtu: Option<u16>,
    every: Every,
}

impl MtuWatch {
    /// Follows `ifname`, its MTU read now (None where it cannot be: no check until it can),
    /// bounded by `most`.
    pub(crate) fn new(ifname: &str, most: u32) -> Self {
        let mut w = Self {
            ifname: ifname.to_string(),
            most,
            mtu: None,
            every: Every::new(Duration::from_secs(1)),
        };
        w.mtu = w.current();
        w
    }

    /// The MTU as last read.
    #[inline]
    pub(crate) fn get(&self) -> Option<u16> {
        self.mtu
    }

    /// Reads the MTU again if a second has passed since the last read; a change is logged.
    /// An interface that cannot be read (gone, renamed) keeps the last MTU.
    #[inline]
    pub(crate) fn poll(&mut self, now: Instant, port: PortId) {
        if self.every.due(now) {
            self.read(port);
        }
    }

    /// The interface's MTU now, bounded; None where it cannot be read.
    fn current(&self) -> Option<u16> {
        let m = crate::sys::tap::link_mtu(&self.ifname).ok()?;
        Some(u16::try_from(m.min(self.most)).unwrap_or(u16::MAX))
    }

    #[cold]
    fn read(&mut self, port: PortId) {
        let Some(m) = self.current() else {
            return;
        };
        if self.mtu != Some(m) {
            tracing::info!(
                port,
                ifname = %self.ifname,
                from = ?self.mtu,
                to = m,
                "the interface's MTU changed: the switch checks frames against the new one"
            );
            self.mtu = Some(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::tap::tests::{ip, private_netns};

    /// An interface's MTU changed (a veth's): seen at the next read past a second, not
    /// before; bounded by what the port carries; an interface that goes keeps the last one.
    #[test]
    fn a_changed_mtu_is_seen_within_a_second_and_bounded() {
        private_netns();
        let name = format!("pvmtu{}", std::process::id() % 10000);
        let peer = format!("{name}p");
        ip(&["link", "add", &name, "type", "veth", "peer", "name", &peer]);
        let mut w = MtuWatch::new(&name, 4000);
        let t0 = Instant::now();
        w.poll(t0, 1);
        assert_eq!(w.get(), Some(1500));
        ip(&["link", "set", &name, "mtu", "3000"]);
        w.poll(t0 + Duration::from_millis(500), 1);
        assert_eq!(w.get(), Some(1500), "read at most once a second");
        w.poll(t0 + Duration::from_millis(1001), 1);
        assert_eq!(w.get(), Some(3000));
        ip(&["link", "set", &name, "mtu", "9000"]);
        w.poll(t0 + Duration::from_millis(2002), 1);
        assert_eq!(w.get(), Some(4000), "bounded by what the port carries");
        ip(&["link", "del", &name]);
        w.poll(t0 + Duration::from_millis(3003), 1);
        assert_eq!(w.get(), Some(4000), "a gone interface keeps the last");
    }
}
