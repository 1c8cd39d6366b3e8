//! An interface's MTU, followed while its port runs: `ip link set dev X mtu N` on a running
//! tap, `AF_PACKET` or `AF_XDP` port takes effect within a second, with no port re-added.
//!
//! The switch checks each packet against its receiver's MTU ([`crate::pkt::fits_mtu`]), so a
//! stale MTU either drops frames the interface would now take (`too_big`) or hands it frames
//! it would refuse. Reading the MTU is a syscall (`SIOCGIFMTU`), so it is read again at most
//! once every [`EVERY`], from the port's transmit and idle hooks: never per packet.

use crate::pkt::PortId;
use std::time::{Duration, Instant};

/// How often the MTU is read again.
const EVERY: Duration = Duration::from_secs(1);

/// The MTU of an interface a port sends to.
#[derive(Debug)]
pub(crate) struct MtuWatch {
    ifname: String,
    /// The most the port's buffers carry: a larger MTU is taken as this.
    most: u32,
    mtu: Option<u16>,
    next: Option<Instant>,
}

impl MtuWatch {
    /// Follows `ifname`, whose MTU is `mtu` now (None: it could not be read: no check until
    /// it can), bounded by `most`.
    pub(crate) fn new(ifname: &str, mtu: Option<u16>, most: u32) -> Self {
        Self {
            ifname: ifname.to_string(),
            most,
            mtu,
            next: None,
        }
    }

    /// The MTU as last read.
    #[inline]
    pub(crate) fn get(&self) -> Option<u16> {
        self.mtu
    }

    /// Reads the MTU again if [`EVERY`] has passed since the last read; a change is logged.
    /// An interface that cannot be read (gone, renamed) keeps the last MTU.
    #[inline]
    pub(crate) fn poll(&mut self, now: Instant, port: PortId) {
        if self.next.is_some_and(|t| now < t) {
            return;
        }
        self.next = Some(now + EVERY);
        self.read(port);
    }

    #[cold]
    fn read(&mut self, port: PortId) {
        let Ok(m) = crate::sys::tap::link_mtu(&self.ifname) else {
            return;
        };
        let m = u16::try_from(m.min(self.most)).unwrap_or(u16::MAX);
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
        let mut w = MtuWatch::new(&name, Some(1500), 4000);
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
