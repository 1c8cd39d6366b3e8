//! 802.1Q VLANs: which VLANs a port carries and how, what VLAN a frame entering the switch is
//! in, and how its tag changes on the way out.
//!
//! A port with no VLAN settings carries VLAN 0, untagged: the one flat segment the switch
//! always had, where a tagged frame is just a frame (its tag is data). An access port
//! (`vlan=N`) carries VLAN N untagged; a trunk (`trunk=A,B-C`, optionally `native=N`) carries
//! its VLANs tagged, and VLAN N untagged. Inside the switch every packet is in one VLAN, and
//! carries its tag or not as it came in ([`Pkt::vlan`]: the VLAN, and [`TAGGED`]); the MAC
//! table is keyed by (VLAN, address), and a frame goes only to ports that carry its VLAN. The
//! link between two shards carries every VLAN with the frame as it is, its VLAN word beside
//! it ([`crate::port::trunk`]).
//!
//! On the way out the tag is inserted (into a trunk) or removed (out of an access port) by
//! re-cutting the packet's segments around it ([`retag`]): the receiving port's one copy then
//! writes the new frame, with no copy of its own here. The virtio-net header moves with it:
//! `csum_start` and a GSO packet's `hdr_len` count from the frame's start, so they move by
//! the tag's 4 bytes.

use crate::pkt::{moved, Pkt};
use pvnet_net::VnetHdr;
use std::fmt;
use std::str::FromStr;
use virtq::Seg;

/// The highest VLAN id (4095 is reserved, 802.1Q 9.6).
pub const VLAN_MAX: u16 = 4094;
/// In [`Pkt::vlan`]: the frame carries its 802.1Q tag.
pub(crate) const TAGGED: u16 = 0x8000;
/// The VLAN id bits of [`Pkt::vlan`] and of a tag's TCI.
pub(crate) const VID: u16 = 0x0fff;
/// 802.1Q's tag protocol identifier.
pub(crate) const TPID: u16 = 0x8100;
/// 802.1ad's (a service tag: never accepted as a customer frame's tag on an access port).
const TPID_QINQ: u16 = 0x88a8;
/// Bytes of a tag.
pub(crate) const TAG_LEN: u32 = 4;
/// Bytes of the two addresses before the tag.
const ADDRS: u32 = 12;
/// Most segments a re-cut packet may have (the sender's, a header, a tag); a packet with
/// more is linearized instead ([`retag_copy`]).
pub(crate) const RETAG_SEGS: usize = 32;

/// A bad VLAN setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VlanError {
    /// A VLAN id out of 1..=4094.
    #[error("VLAN {0} is out of range (1 to 4094)")]
    Range(u32),
    /// Not a number or a range of numbers.
    #[error("'{0}' is not a VLAN or a range of VLANs (A or B-C, 1 to 4094)")]
    Word(String),
    /// A range whose end is below its start.
    #[error("the VLAN range {0}-{1} is empty (its end is below its start)")]
    EmptyRange(u16, u16),
    /// A trunk list with nothing in it.
    #[error("a trunk needs at least one VLAN (trunk=A,B-C)")]
    EmptyTrunk,
    /// `vlan=` with `trunk=` or `native=`.
    #[error("vlan= makes an access port; trunk= and native= make a trunk: not both")]
    AccessAndTrunk,
    /// `native=` without `trunk=`.
    #[error("native= needs trunk= (an access port's frames are all untagged already)")]
    NativeWithoutTrunk,
}

/// A set of VLAN ids, 1..=4094: a bitmap.
#[derive(Clone, PartialEq, Eq)]
pub struct VlanSet(Box<[u64; 64]>);

impl VlanSet {
    /// No VLAN.
    pub fn new() -> Self {
        Self(Box::new([0; 64]))
    }

    /// Adds `v` (ids out of range are ignored: the parsers check them).
    pub fn insert(&mut self, v: u16) {
        if (1..=VLAN_MAX).contains(&v) {
            self.0[usize::from(v / 64)] |= 1 << (v % 64);
        }
    }

    /// Whether `v` is in.
    #[inline]
    pub fn contains(&self, v: u16) -> bool {
        v <= VID && self.0[usize::from(v / 64)] & (1 << (v % 64)) != 0
    }

    /// Whether none is in.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// The ids in, in order.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (1..=VLAN_MAX).filter(|&v| self.contains(v))
    }
}

impl Default for VlanSet {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VlanSet({self})")
    }
}

/// The set as it is written: `10,20-30`.
impl fmt::Display for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(a) = it.next() {
            let mut b = a;
            while it.peek() == Some(&(b + 1)) {
                b += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

/// One VLAN id, checked against 1..=4094.
pub fn vlan_id(v: u32) -> Result<u16, VlanError> {
    u16::try_from(v)
        .ok()
        .filter(|v| (1..=VLAN_MAX).contains(v))
        .ok_or(VlanError::Range(v))
}

fn parse_id(s: &str) -> Result<u16, VlanError> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| VlanError::Word(s.trim().to_owned()))?;
    vlan_id(n)
}

/// `A,B-C,...` (spaces allowed around each piece).
impl FromStr for VlanSet {
    type Err = VlanError;
    fn from_str(s: &str) -> Result<Self, VlanError> {
        let mut set = VlanSet::new();
        for part in s.split(',').map(str::trim) {
            if part.is_empty() {
                continue;
            }
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (parse_id(a)?, parse_id(b)?);
                    if b < a {
                        return Err(VlanError::EmptyRange(a, b));
                    }
                    for v in a..=b {
                        set.insert(v);
                    }
                }
                None => set.insert(parse_id(part)?),
            }
        }
        if set.is_empty() {
            return Err(VlanError::EmptyTrunk);
        }
        Ok(set)
    }
}

/// A port's VLAN settings (a port with none carries VLAN 0 untagged: see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VlanMode {
    /// Carries one VLAN, untagged at the port (`vlan=N`).
    Access(u16),
    /// Carries these VLANs tagged (`trunk=A,B-C`), and one untagged if it has a native
    /// VLAN (`native=N`, carried whether or not it is in the list).
    Trunk {
        /// The tagged VLANs.
        allowed: VlanSet,
        /// The VLAN of its untagged frames.
        native: Option<u16>,
    },
}

impl VlanMode {
    /// The settings of a port's `vlan=`, `trunk=` and `native=` keys (None: none given).
    pub fn from_keys(
        vlan: Option<u32>,
        trunk: Option<&str>,
        native: Option<u32>,
    ) -> Result<Option<Self>, VlanError> {
        match (vlan, trunk, native) {
            (None, None, None) => Ok(None),
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(VlanError::AccessAndTrunk),
            (Some(v), None, None) => Ok(Some(VlanMode::Access(vlan_id(v)?))),
            (None, None, Some(_)) => Err(VlanError::NativeWithoutTrunk),
            (None, Some(t), n) => Ok(Some(VlanMode::Trunk {
                allowed: t.parse()?,
                native: n.map(vlan_id).transpose()?,
            })),
        }
    }

    /// Whether it carries VLAN `v`.
    #[inline]
    pub fn carries(&self, v: u16) -> bool {
        match self {
            VlanMode::Access(a) => *a == v,
            VlanMode::Trunk { allowed, native } => *native == Some(v) || allowed.contains(v),
        }
    }

    /// Every VLAN it carries, in order (a native VLAN not in the list first).
    pub fn vlans(&self) -> impl Iterator<Item = u16> + '_ {
        let (one, set) = match self {
            VlanMode::Access(a) => (Some(*a), None),
            VlanMode::Trunk { allowed, native } => {
                (native.filter(|n| !allowed.contains(*n)), Some(allowed))
            }
        };
        one.into_iter()
            .chain(set.into_iter().flat_map(VlanSet::iter))
    }

    /// The VLAN of the frames it sends untagged, if any (the one its own station's address
    /// is learned in when a frontend announces it).
    pub fn untagged(&self) -> Option<u16> {
        match self {
            VlanMode::Access(a) => Some(*a),
            VlanMode::Trunk { native, .. } => *native,
        }
    }
}

/// `vlan 10`, `trunk 10,20-30 native 5`.
impl fmt::Display for VlanMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VlanMode::Access(v) => write!(f, "vlan {v}"),
            VlanMode::Trunk { allowed, native } => {
                write!(f, "trunk {allowed}")?;
                if let Some(n) = native {
                    write!(f, " native {n}")?;
                }
                Ok(())
            }
        }
    }
}

/// How a port stands to VLANs, as the switch sees it for one burst.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side<'a> {
    /// No settings: VLAN 0, untagged.
    Plain,
    /// Access or trunk.
    Mode(&'a VlanMode),
    /// A link to another shard: every VLAN, each frame as it is, its VLAN word beside it.
    Shard,
}

/// What a packet's tag needs on its way out of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// Nothing.
    Pass,
    /// A tag with this VLAN inserted after the addresses.
    Insert(u16),
    /// Its tag removed.
    Strip,
}

/// The settings of the ports that have some, by port id (sorted): what the switch asks per
/// burst and per receiver while any port has settings. Every shard holds all of them (a port
/// may move between shards).
#[derive(Debug, Default)]
pub(crate) struct Vlans {
    ports: Vec<(crate::pkt::PortId, VlanMode)>,
}

impl Vlans {
    /// Whether any port has settings (else the switch takes its plain path).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        !self.ports.is_empty()
    }

    /// Port `id`'s settings.
    #[inline]
    pub(crate) fn of(&self, id: crate::pkt::PortId) -> Option<&VlanMode> {
        self.ports
            .binary_search_by_key(&id, |(p, _)| *p)
            .ok()
            .map(|k| &self.ports[k].1)
    }

    /// Whether some port with settings carries VLAN `v`.
    pub(crate) fn carried(&self, v: u16) -> bool {
        self.ports.iter().any(|(_, m)| m.carries(v))
    }

    /// Gives port `id` its settings (None: none); returns the old ones.
    pub(crate) fn set(
        &mut self,
        id: crate::pkt::PortId,
        mode: Option<VlanMode>,
    ) -> Option<VlanMode> {
        match (self.ports.binary_search_by_key(&id, |(p, _)| *p), mode) {
            (Ok(k), Some(m)) => Some(std::mem::replace(&mut self.ports[k].1, m)),
            (Ok(k), None) => Some(self.ports.remove(k).1),
            (Err(k), Some(m)) => {
                self.ports.insert(k, (id, m));
                None
            }
            (Err(_), None) => None,
        }
    }
}

/// The 4 bytes after a packet's addresses (its tag, or its ethertype and 2 more), if the
/// frame holds them.
#[inline]
fn after_addrs(p: &Pkt<'_>) -> Option<[u8; 4]> {
    let off = p.hdr_len + ADDRS;
    if p.len < off + TAG_LEN {
        return None;
    }
    if let Some(b) = p.segs.first().and_then(|s| s.read_array::<4>(off)) {
        return Some(b);
    }
    let mut b = [0u8; 4];
    (virtq::read_segs(p.segs, off, &mut b) == b.len()).then_some(b)
}

/// The type after a packet's addresses and the VLAN id it would carry if that were a tag
/// (`(0, 0)` for a frame too short to hold one).
#[inline]
fn tag_of(p: &Pkt<'_>) -> (u16, u16) {
    after_addrs(p).map_or((0, 0), |b| {
        (
            u16::from_be_bytes([b[0], b[1]]),
            u16::from_be_bytes([b[2], b[3]]) & VID,
        )
    })
}

/// The VLAN word ([`Pkt::vlan`]) of a packet entering through a port on `side`, or None if
/// the port does not carry its VLAN (dropped: `vlan_filtered`). A frame too short to hold a
/// tag is untagged.
#[inline]
pub(crate) fn classify(side: Side<'_>, p: &Pkt<'_>) -> Option<u16> {
    let mode = match side {
        Side::Plain => return Some(0),
        Side::Shard => return Some(p.vlan),
        Side::Mode(m) => m,
    };
    let (tpid, vid) = tag_of(p);
    match mode {
        VlanMode::Access(v) => (tpid != TPID && tpid != TPID_QINQ).then_some(*v),
        VlanMode::Trunk { allowed, native } => {
            if tpid == TPID {
                // A priority tag (VID 0) or a VLAN the trunk does not carry: refused.
                (vid != 0 && (allowed.contains(vid) || *native == Some(vid)))
                    .then_some(vid | TAGGED)
            } else {
                *native
            }
        }
    }
}

/// What the packets after a run's first must show to classify as its word ([`classify`]):
/// the run's check with the sender's settings already applied, so that it holds no borrow
/// of them and asks nothing of them per packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Same {
    /// A port without settings: every packet is in VLAN 0.
    Any,
    /// A trunk between shards: the word the record carries.
    Shard(u16),
    /// No 802.1Q tag (and, on an access port, no 802.1ad tag either).
    Untagged { qinq: bool },
    /// An 802.1Q tag of this VLAN.
    Tagged(u16),
}

impl Same {
    /// The check for packets from a port on `side` whose run classified as `word`.
    #[inline]
    pub(crate) fn of(side: Side<'_>, word: u16) -> Self {
        match side {
            Side::Plain => Same::Any,
            Side::Shard => Same::Shard(word),
            Side::Mode(VlanMode::Access(_)) => Same::Untagged { qinq: true },
            Side::Mode(VlanMode::Trunk { .. }) if word & TAGGED != 0 => Same::Tagged(word & VID),
            Side::Mode(VlanMode::Trunk { .. }) => Same::Untagged { qinq: false },
        }
    }

    /// Whether `p` classifies as the run's word.
    #[inline]
    pub(crate) fn holds(self, p: &Pkt<'_>) -> bool {
        match self {
            Same::Any => true,
            Same::Shard(w) => p.vlan == w,
            Same::Untagged { qinq } => {
                let (tpid, _) = tag_of(p);
                tpid != TPID && !(qinq && tpid == TPID_QINQ)
            }
            Same::Tagged(vid) => tag_of(p) == (TPID, vid),
        }
    }
}

/// What a packet with VLAN word `word` needs to leave through a port on `side`, or None if
/// the port does not carry its VLAN.
#[inline]
pub(crate) fn egress(side: Side<'_>, word: u16) -> Option<Act> {
    let vid = word & VID;
    let tagged = word & TAGGED != 0;
    let want_tag = match side {
        Side::Shard => return Some(Act::Pass),
        Side::Plain => return (vid == 0).then_some(Act::Pass),
        Side::Mode(m) if !m.carries(vid) => return None,
        Side::Mode(VlanMode::Access(_)) => false,
        Side::Mode(VlanMode::Trunk { native, .. }) => *native != Some(vid),
    };
    Some(match (want_tag, tagged) {
        (true, false) => Act::Insert(vid),
        (false, true) => Act::Strip,
        _ => Act::Pass,
    })
}

/// Appends to `out` (from `*n` on) segments over bytes `from..to` of `segs`; false if they
/// do not hold them or `out` is full.
fn cut<'m>(segs: &[Seg<'m>], from: u32, to: u32, out: &mut [Seg<'m>], n: &mut usize) -> bool {
    let mut at = 0u32;
    let mut need = from;
    for s in segs {
        let end = at.saturating_add(s.len());
        if end > need && need < to {
            let off = need - at;
            let len = end.min(to) - need;
            let Some(piece) = s.sub(off, len) else {
                return false;
            };
            let Some(slot) = out.get_mut(*n) else {
                return false;
            };
            *slot = piece;
            *n += 1;
            need += len;
        }
        if need >= to {
            return true;
        }
        at = end;
    }
    need >= to
}

/// Bytes in front of a re-cut frame: the largest virtio-net header, the addresses, a tag.
pub(crate) const HEAD: usize = VnetHdr::LEN + ADDRS as usize + TAG_LEN as usize;

/// The packet `p` with its tag inserted or removed (`act`), re-cut over its own memory: a
/// new header, the addresses and the tag in `head`, the segments in `out`. None if it cannot be cut so
/// (more segments than `out` holds: [`retag_copy`] then; or a header pointing into the tag).
pub(crate) fn retag<'m>(
    p: &Pkt<'m>,
    act: Act,
    word: u16,
    head: &'m mut [u8; HEAD],
    out: &'m mut [Seg<'m>],
) -> Option<Pkt<'m>> {
    let (h, skip, len, vlan) = match act {
        Act::Pass => return Some(Pkt { vlan: word, ..*p }),
        Act::Insert(v) => (
            moved(&p.hdr, true)?,
            0,
            p.len.checked_add(TAG_LEN)?,
            v | TAGGED,
        ),
        Act::Strip => (
            moved(&p.hdr, false)?,
            TAG_LEN,
            p.len.checked_sub(TAG_LEN)?,
            word & VID,
        ),
    };
    let hl = p.hdr_len;
    let addrs = hl + ADDRS;
    // The new header, the addresses (copied: 12 bytes) and the tag in one segment of their
    // own, the rest of the frame re-cut over its memory: two segments for a plain frame.
    let (hu, au) = (hl as usize, addrs as usize);
    if hu > VnetHdr::LEN {
        return None;
    }
    h.write(&mut head[..]);
    // The addresses as the source port read them with the header (`Pkt::macs`).
    head[hu..au].copy_from_slice(&p.macs);
    let end = if let Act::Insert(v) = act {
        head[au..au + 2].copy_from_slice(&TPID.to_be_bytes());
        head[au + 2..au + 4].copy_from_slice(&v.to_be_bytes());
        au + TAG_LEN as usize
    } else {
        au
    };
    *out.first_mut()? = Seg::from_mut(&mut head[..end]);
    let from = addrs + skip;
    let rest = p.len.checked_sub(from)?;
    let n = match *p.segs {
        // The rest in the last of one or two segments (a frame in one buffer, its header
        // in front or apart): one cut, no walk.
        [s] => {
            *out.get_mut(1)? = s.sub(from, rest)?;
            2
        }
        [first, s] if first.len() <= from => {
            *out.get_mut(1)? = s.sub(from - first.len(), rest)?;
            2
        }
        _ => {
            let mut n = 1;
            if !cut(p.segs, from, p.len, &mut out[..], &mut n) {
                return None;
            }
            n
        }
    };
    Some(Pkt {
        segs: &out[..n],
        len,
        hdr: h,
        vlan,
        ..*p
    })
}

/// [`retag`] by a copy into `buf` (a packet of too many segments): the one case with a
/// second copy. None if the packet does not fit `buf` or its header points into the tag.
pub(crate) fn retag_copy<'m>(
    p: &Pkt<'_>,
    act: Act,
    buf: &'m mut [u8],
    seg: &'m mut [Seg<'m>; 1],
) -> Option<Pkt<'m>> {
    let (h, vlan, len) = match act {
        Act::Pass => return None,
        Act::Insert(v) => (moved(&p.hdr, true)?, v | TAGGED, p.len + TAG_LEN),
        Act::Strip => (
            moved(&p.hdr, false)?,
            p.vlan & VID,
            p.len.checked_sub(TAG_LEN)?,
        ),
    };
    let hl = p.hdr_len as usize;
    let addrs = hl + ADDRS as usize;
    let buf = buf.get_mut(..len as usize)?;
    let mut hb = [0u8; VnetHdr::LEN];
    h.write(&mut hb);
    buf[..hl].copy_from_slice(&hb[..hl]);
    buf[hl..addrs].copy_from_slice(&p.macs);
    match act {
        Act::Insert(v) => {
            buf[addrs..addrs + 2].copy_from_slice(&TPID.to_be_bytes());
            buf[addrs + 2..addrs + 4].copy_from_slice(&v.to_be_bytes());
            virtq::read_segs(p.segs, p.hdr_len + ADDRS, &mut buf[addrs + 4..]);
        }
        _ => {
            virtq::read_segs(p.segs, p.hdr_len + ADDRS + TAG_LEN, &mut buf[addrs..]);
        }
    }
    seg[0] = Seg::from_mut(buf);
    Some(Pkt {
        segs: &seg[..],
        len,
        hdr: h,
        vlan,
        ..*p
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvnet_net::HDR_LEN;

    #[test]
    fn sets_parse_print_and_refuse_bad_lists() {
        let s: VlanSet = "10, 20-23,4094,1".parse().unwrap();
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            vec![1, 10, 20, 21, 22, 23, 4094]
        );
        assert_eq!(s.to_string(), "1,10,20-23,4094");
        assert!(s.contains(22) && !s.contains(24) && !s.contains(0) && !s.contains(4095));
        for (bad, want) in [
            ("0", VlanError::Range(0)),
            ("4095", VlanError::Range(4095)),
            ("30-20", VlanError::EmptyRange(30, 20)),
            ("", VlanError::EmptyTrunk),
            (",", VlanError::EmptyTrunk),
            ("ten", VlanError::Word("ten".into())),
            ("5-", VlanError::Word(String::new())),
        ] {
            assert_eq!(bad.parse::<VlanSet>().unwrap_err(), want, "{bad}");
        }
    }

    #[test]
    fn modes_from_keys() {
        assert_eq!(VlanMode::from_keys(None, None, None), Ok(None));
        assert_eq!(
            VlanMode::from_keys(Some(10), None, None),
            Ok(Some(VlanMode::Access(10)))
        );
        let t = VlanMode::from_keys(None, Some("10,20-21"), Some(5))
            .unwrap()
            .unwrap();
        assert!(t.carries(5) && t.carries(21) && !t.carries(11) && !t.carries(0));
        assert_eq!(t.untagged(), Some(5));
        assert_eq!(t.vlans().collect::<Vec<_>>(), vec![5, 10, 20, 21]);
        assert_eq!(VlanMode::Access(9).vlans().collect::<Vec<_>>(), vec![9]);
        assert_eq!(t.to_string(), "trunk 10,20-21 native 5");
        for (v, tr, n, e) in [
            (Some(10), Some("20"), None, VlanError::AccessAndTrunk),
            (Some(10), None, Some(5), VlanError::AccessAndTrunk),
            (None, None, Some(5), VlanError::NativeWithoutTrunk),
            (Some(0), None, None, VlanError::Range(0)),
            (Some(5000), None, None, VlanError::Range(5000)),
            (None, Some("20"), Some(4095), VlanError::Range(4095)),
        ] {
            assert_eq!(VlanMode::from_keys(v, tr, n), Err(e));
        }
    }

    #[test]
    fn vlans_keep_their_ports_sorted() {
        let mut v = Vlans::default();
        assert!(!v.active());
        assert_eq!(v.set(7, Some(VlanMode::Access(7))), None);
        v.set(3, Some(VlanMode::Access(3)));
        v.set(5, Some(VlanMode::Access(5)));
        assert_eq!(v.of(5), Some(&VlanMode::Access(5)));
        assert_eq!(v.of(4), None);
        assert_eq!(
            v.set(5, Some(VlanMode::Access(50))),
            Some(VlanMode::Access(5))
        );
        assert_eq!(v.set(3, None), Some(VlanMode::Access(3)));
        assert_eq!(v.of(3), None);
        assert_eq!(v.of(7), Some(&VlanMode::Access(7)));
        assert!(v.active());
    }

    /// A frame's bytes: the header `h`, broadcast and a station's address, then `rest` (an
    /// ethertype, maybe a tag first).
    fn frame(h: VnetHdr, rest: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HDR_LEN as usize];
        h.write(&mut b);
        b.extend_from_slice(&[0xff; 6]);
        b.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
        b.extend_from_slice(rest);
        b
    }

    /// The packet over `segs`, its addresses read as a source port reads them.
    fn pkt<'a>(segs: &'a [Seg<'a>], len: usize, hdr: VnetHdr) -> Pkt<'a> {
        let mut macs = [0; 12];
        assert_eq!(virtq::read_segs(segs, HDR_LEN, &mut macs), 12);
        Pkt {
            segs,
            len: u32::try_from(len).unwrap(),
            hdr_len: HDR_LEN,
            hdr,
            macs,
            hash: 0,
            vlan: 0,
        }
    }

    fn bytes(p: &Pkt<'_>) -> Vec<u8> {
        let mut b = vec![0u8; p.len as usize];
        assert_eq!(virtq::read_segs(p.segs, 0, &mut b), b.len());
        b
    }

    /// Segments over `buf`, a new one at each offset of `cuts`.
    fn split_at<'a>(buf: &'a mut [u8], cuts: &[usize]) -> Vec<Seg<'a>> {
        let mut out = Vec::new();
        let mut rest = buf;
        let mut at = 0;
        for &c in cuts {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(c - at);
            out.push(Seg::from_mut(a));
            rest = b;
            at = c;
        }
        out.push(Seg::from_mut(rest));
        out
    }

    /// An access port of VLAN 7, a trunk of 10-20 with native VLAN 5, a trunk of 10 alone.
    fn modes() -> (VlanMode, VlanMode, VlanMode) {
        let trunk = |list, native| {
            VlanMode::from_keys(None, Some(list), native)
                .unwrap()
                .unwrap()
        };
        (
            VlanMode::Access(7),
            trunk("10-20", Some(5)),
            trunk("10", None),
        )
    }

    /// Access frames are classified into their VLAN, tagged ones refused; a trunk takes its
    /// VLANs tagged and its native one untagged, and refuses the rest.
    #[test]
    fn classify_by_port() {
        let h = VnetHdr::default();
        let mut untagged = frame(h, &[0x08, 0x00, 0x45, 0]);
        let mut tagged10 = frame(h, &[0x81, 0x00, 0x20, 10, 0x08, 0x00]);
        let mut tagged30 = frame(h, &[0x81, 0x00, 0x00, 30, 0x08, 0x00]);
        let mut prio = frame(h, &[0x81, 0x00, 0xe0, 0, 0x08, 0x00]);
        let lens = [untagged.len(), tagged10.len(), tagged30.len(), prio.len()];
        let u = [Seg::from_mut(&mut untagged)];
        // Split right inside the tag: read across segments.
        let t10 = split_at(&mut tagged10, &[HDR_LEN as usize + 13]);
        let t30 = [Seg::from_mut(&mut tagged30)];
        let pr = [Seg::from_mut(&mut prio)];
        let (u, t10, t30, pr) = (
            pkt(&u, lens[0], h),
            pkt(&t10, lens[1], h),
            pkt(&t30, lens[2], h),
            pkt(&pr, lens[3], h),
        );
        let (access, trunk, bare) = modes();
        let c = |m: &VlanMode, p: &Pkt<'_>| classify(Side::Mode(m), p);
        assert_eq!(c(&access, &u), Some(7));
        assert_eq!(c(&access, &t10), None, "a tag on an access port");
        assert_eq!(
            c(&trunk, &t10),
            Some(10 | TAGGED),
            "the PCP bits are not the VLAN"
        );
        assert_eq!(c(&trunk, &t30), None, "not in the list");
        assert_eq!(c(&trunk, &u), Some(5), "native");
        assert_eq!(c(&bare, &u), None, "untagged on a trunk without native");
        assert_eq!(c(&trunk, &pr), None, "a priority tag");
        assert_eq!(
            classify(Side::Plain, &t10),
            Some(0),
            "a plain port's tag is data"
        );
        let from_shard = Pkt {
            vlan: 33 | TAGGED,
            ..t10
        };
        assert_eq!(classify(Side::Shard, &from_shard), Some(33 | TAGGED));
    }

    /// A run's check ([`Same`]) takes exactly the packets [`classify`] puts in the run's
    /// VLAN, for every kind of frame and port.
    #[test]
    fn a_runs_check_agrees_with_classify() {
        let h = VnetHdr::default();
        let rests: [&[u8]; 7] = [
            &[0x08, 0x00, 0x45, 0],
            &[0x81, 0x00, 0x20, 10, 0x08, 0x00],
            &[0x81, 0x00, 0x00, 20, 0x08, 0x00],
            &[0x81, 0x00, 0x00, 30, 0x08, 0x00],
            &[0x81, 0x00, 0xe0, 0, 0x08, 0x00],
            &[0x88, 0xa8, 0x00, 10, 0x81, 0x00],
            &[0x08],
        ];
        let mut bufs: Vec<Vec<u8>> = rests.iter().map(|r| frame(h, r)).collect();
        let lens: Vec<usize> = bufs.iter().map(Vec::len).collect();
        let segs: Vec<[Seg<'_>; 1]> = bufs.iter_mut().map(|b| [Seg::from_mut(b)]).collect();
        let pkts: Vec<Pkt<'_>> = segs.iter().zip(&lens).map(|(s, &l)| pkt(s, l, h)).collect();
        let (access, trunk, bare) = modes();
        let mut runs = 0;
        for side in [
            Side::Plain,
            Side::Mode(&access),
            Side::Mode(&trunk),
            Side::Mode(&bare),
        ] {
            for first in &pkts {
                let Some(word) = classify(side, first) else {
                    continue;
                };
                let same = Same::of(side, word);
                for p in &pkts {
                    assert_eq!(
                        same.holds(p),
                        classify(side, p) == Some(word),
                        "{side:?} {p:?}"
                    );
                }
                runs += 1;
            }
        }
        assert!(runs >= 10, "{runs} runs checked");
        let a = Pkt {
            vlan: 33 | TAGGED,
            ..pkts[0]
        };
        let b = Pkt { vlan: 34, ..a };
        assert!(Same::of(Side::Shard, a.vlan).holds(&a));
        assert!(!Same::of(Side::Shard, a.vlan).holds(&b));
    }

    #[test]
    fn egress_acts_by_port() {
        let access = VlanMode::Access(7);
        let trunk = VlanMode::from_keys(None, Some("7,10"), Some(5))
            .unwrap()
            .unwrap();
        let e = |m: &VlanMode, w: u16| egress(Side::Mode(m), w);
        assert_eq!(e(&access, 7), Some(Act::Pass));
        assert_eq!(e(&access, 7 | TAGGED), Some(Act::Strip));
        assert_eq!(e(&access, 10), None);
        assert_eq!(e(&trunk, 7), Some(Act::Insert(7)));
        assert_eq!(e(&trunk, 10 | TAGGED), Some(Act::Pass));
        assert_eq!(e(&trunk, 5), Some(Act::Pass), "native leaves untagged");
        assert_eq!(e(&trunk, 5 | TAGGED), Some(Act::Strip));
        assert_eq!(e(&trunk, 0), None);
        assert_eq!(egress(Side::Plain, 0), Some(Act::Pass));
        assert_eq!(egress(Side::Plain, 7), None);
        assert_eq!(egress(Side::Shard, 7 | TAGGED), Some(Act::Pass));
    }

    /// Insert then strip, over a packet in 3 segments cut across the addresses and the
    /// ethertype: the bytes are the frame with the tag in (then out), the header's checksum
    /// offset and GSO header length move by 4, and the copy path gives the same bytes.
    #[test]
    fn insert_and_strip_recut_the_frame_and_move_the_offsets() {
        let h = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: VnetHdr::GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 0,
        };
        let payload: Vec<u8> = (0..100u8).collect();
        let mut rest = vec![0x08, 0x00];
        rest.extend_from_slice(&payload);
        let hl = HDR_LEN as usize;
        // One buffer, the header apart (the one-cut paths), the header cut and the
        // addresses across three segments (the walk).
        let layouts: [&[usize]; 4] = [&[], &[hl], &[hl, hl + 30], &[5, hl + 7, hl + 13]];
        for cuts in layouts {
            let mut plain = frame(h, &rest);
            let orig = plain.clone();
            let len = plain.len();
            let segs = split_at(&mut plain, cuts);
            let p = pkt(&segs, len, h);

            let (mut hb, mut out) = ([0u8; HEAD], [Seg::from_mut(&mut []); RETAG_SEGS]);
            let q = retag(&p, Act::Insert(300), 300, &mut hb, &mut out).unwrap();
            assert_eq!(q.vlan, 300 | TAGGED);
            assert_eq!(q.len as usize, len + 4);
            assert_eq!((q.hdr.csum_start, q.hdr.hdr_len), (38, 58));
            let b = bytes(&q);
            assert_eq!(
                VnetHdr::parse(&b).unwrap(),
                q.hdr,
                "the header bytes say the same"
            );
            assert_eq!(&b[hl..hl + 12], &orig[hl..hl + 12], "{cuts:?}");
            assert_eq!(&b[hl + 12..hl + 16], &[0x81, 0x00, 0x01, 0x2c]);
            assert_eq!(&b[hl + 16..], &orig[hl + 12..], "{cuts:?}");

            let mut copy = vec![0u8; 4096];
            let mut one = [Seg::from_mut(&mut [])];
            let c = retag_copy(&p, Act::Insert(300), &mut copy, &mut one).unwrap();
            assert_eq!(bytes(&c), b, "the copy path makes the same frame");

            // And back: strip the tag from the re-cut packet (its head apart, the rest in
            // one segment or several), and from the tagged frame in one buffer.
            let (mut hb2, mut out2) = ([0u8; HEAD], [Seg::from_mut(&mut []); RETAG_SEGS]);
            let r = retag(&q, Act::Strip, q.vlan, &mut hb2, &mut out2).unwrap();
            assert_eq!(r.vlan, 300);
            assert_eq!(bytes(&r), orig, "stripped: the original frame ({cuts:?})");
            assert_eq!((r.hdr.csum_start, r.hdr.hdr_len), (34, 54));
            let mut tagged = b.clone();
            let one_buf = [Seg::from_mut(&mut tagged)];
            let t = Pkt {
                segs: &one_buf,
                ..q
            };
            let (mut hb3, mut out3) = ([0u8; HEAD], [Seg::from_mut(&mut []); RETAG_SEGS]);
            let r1 = retag(&t, Act::Strip, t.vlan, &mut hb3, &mut out3).unwrap();
            assert_eq!(bytes(&r1), orig, "stripped from one buffer");
            let mut copy2 = vec![0u8; 4096];
            let mut one2 = [Seg::from_mut(&mut [])];
            let c2 = retag_copy(&q, Act::Strip, &mut copy2, &mut one2).unwrap();
            assert_eq!(bytes(&c2), orig);
        }
        // A checksum starting inside the tag cannot be stripped.
        let mut t = frame(h, &rest);
        t.splice(hl + 12..hl + 12, [0x81, 0x00, 0x01, 0x2c]);
        let len = t.len();
        let segs = [Seg::from_mut(&mut t)];
        let bad = Pkt {
            vlan: 300 | TAGGED,
            ..pkt(
                &segs,
                len,
                VnetHdr {
                    csum_start: 14,
                    ..h
                },
            )
        };
        let (mut hb3, mut out3) = ([0u8; HEAD], [Seg::from_mut(&mut []); RETAG_SEGS]);
        assert!(retag(&bad, Act::Strip, bad.vlan, &mut hb3, &mut out3).is_none());
    }
}
