//! Placement by load: which worker a new port goes to, and when a port moves to another.
//!
//! What is measured, once an interval (default 1 s), by the control plane:
//! - each shard's **busy share**: the time of its rounds that moved at least one packet, over
//!   the interval (a shard that polls empty rings, or sleeps, is not busy: the measure OVS
//!   uses for its PMD threads);
//! - each port's **packets** (received and sent) over the interval, and each shard's total
//!   (its trunks' hand-offs included).
//!
//! A port's cost is its shard's busy share split by packets: `busy × port / shard total`.
//! That is an estimate (a packet of a port with offloads or large frames costs more than
//! one of 64 bytes), and the move it leads to is checked by measuring afterwards.
//!
//! **When a port moves** ([`Balancer::step`]): one shard has been busy at least `hot`
//! (95%) for `sustain` (3) intervals running, and moving one of its vhost-user ports to the
//! least busy shard would bring the busier of the two down by at least `min_gain` (10
//! points), as predicted from the costs above, and the machine has the port's cost in idle
//! CPU, and at least half a CPU: a worker with room but no CPU to run on would take it from
//! the frontends (`spare` in [`RebalanceConfig`] replaces the measurement, for a container
//! whose `/proc/stat` is the host's). A single port that fills a shard alone is
//! never moved (the prediction does not improve). At most one move per `cooldown` (10 s).
//!
//! **Measured afterwards:** once the cooldown has passed, the switch's packet rate is
//! compared with the rate before the move; if it fell by more than `max_loss` (5%), as it
//! does when the port's traffic now crosses workers and pays the hand-off, or when the
//! workers now compete with the frontends for CPUs, the port goes back and is not moved
//! again for ten cooldowns. A rate that fell below a tenth (the traffic stopped) says
//! nothing about the move, which stands.
//!
//! **No reordering** comes from a move; see `Dataplane::move_port`.
//!
//! **A new port** goes to the least busy shard; among shards within 5 points of it, the one
//! with the fewest ports, then the lowest index (so ports connected while all is idle are
//! dealt round-robin).

use crate::pkt::PortId;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// When and how ports are moved between workers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RebalanceConfig {
    /// Whether ports move at all (placement of new ports by load happens either way).
    pub enabled: bool,
    /// How often shards are measured.
    pub interval: Duration,
    /// Busy share from which a shard counts as saturated.
    pub hot: f64,
    /// Intervals running a shard must be saturated before a port leaves it.
    pub sustain: u32,
    /// Least predicted fall of the busier shard's share for a move to be made.
    pub min_gain: f64,
    /// Least time between two moves; also how long a move runs before it is judged.
    pub cooldown: Duration,
    /// Largest fall of the switch's packet rate a move may cause before it is undone.
    pub max_loss: f64,
    /// CPUs taken as idle instead of measuring `/proc/stat` (None: measure).
    pub spare: Option<f64>,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(1),
            hot: 0.95,
            sustain: 3,
            min_gain: 0.10,
            cooldown: Duration::from_secs(10),
            max_loss: 0.05,
            spare: None,
        }
    }
}

/// One port as measured over an interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PortLoad {
    /// The port.
    pub id: PortId,
    /// The shard it is on.
    pub shard: usize,
    /// Packets it received and sent over the interval.
    pub packets: u64,
    /// Whether it may move (a vhost-user port; a trunk or a host port never does).
    pub movable: bool,
}

/// One interval's measurement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// Each shard's busy share, 0 to 1.
    pub busy: Vec<f64>,
    /// Every port, trunks included (their packets are their shard's work too).
    pub ports: Vec<PortLoad>,
    /// CPUs the machine had to spare over the interval: idle, or taken by processes niced
    /// below the switch (which yield to it); infinite when unknown.
    pub spare_cpus: f64,
}

impl Default for Sample {
    fn default() -> Self {
        Self {
            busy: Vec::new(),
            ports: Vec::new(),
            spare_cpus: f64::INFINITY,
        }
    }
}

impl Sample {
    /// Packets moved by the switch over the interval (user ports only: a packet that
    /// crossed a trunk is counted once).
    pub(crate) fn packets(&self) -> u64 {
        self.ports
            .iter()
            .filter(|p| p.movable)
            .map(|p| p.packets)
            .sum()
    }

    /// Shard `k`'s busy share (0 if it was not measured).
    fn busy_of(&self, k: usize) -> f64 {
        self.busy.get(k).copied().unwrap_or(0.0)
    }
}

/// What the balancer decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Decision {
    /// Nothing to do.
    Stay,
    /// Move `port` from shard `from` to shard `to`; `busy` is the predicted busy share of
    /// the two afterwards.
    Move {
        /// The port.
        port: PortId,
        /// Its shard now.
        from: usize,
        /// Where it goes.
        to: usize,
        /// Predicted busy share of `from` and `to` afterwards.
        busy: (f64, f64),
    },
    /// The last move lowered the switch's rate: `port` goes back from `from` to `to`.
    Undo {
        /// The port.
        port: PortId,
        /// Its shard now.
        from: usize,
        /// Its shard before the move.
        to: usize,
        /// The rate before and after the move, packets per interval.
        rate: (u64, u64),
    },
}

/// A move waiting to be judged.
#[derive(Debug, Clone, Copy)]
struct Trial {
    port: PortId,
    from: usize,
    to: usize,
    before: u64,
}

/// The rebalancing state machine (pure: the caller measures and moves).
#[derive(Debug)]
pub(crate) struct Balancer {
    cfg: RebalanceConfig,
    /// Intervals running each shard has been saturated.
    hot_for: Vec<u32>,
    /// No move before this.
    quiet_until: Option<Instant>,
    trial: Option<Trial>,
    /// Ports whose move was undone, and until when they stay put.
    pinned: BTreeMap<PortId, Instant>,
}

impl Balancer {
    /// A balancer over `shards` shards.
    pub(crate) fn new(cfg: RebalanceConfig, shards: usize) -> Self {
        Self {
            cfg,
            hot_for: vec![0; shards],
            quiet_until: None,
            trial: None,
            pinned: BTreeMap::new(),
        }
    }

    /// Takes one interval's measurement; says what to do. The caller reports a move it
    /// could not make with [`Balancer::failed`].
    pub(crate) fn step(&mut self, s: &Sample, now: Instant) -> Decision {
        for (k, h) in self.hot_for.iter_mut().enumerate() {
            *h = if s.busy_of(k) >= self.cfg.hot {
                *h + 1
            } else {
                0
            };
        }
        self.pinned.retain(|_, until| *until > now);
        if self.quiet_until.is_some_and(|t| now < t) {
            return Decision::Stay;
        }
        if let Some(t) = self.trial.take() {
            // A rate that fell is taken as the move's doing, unless the traffic stopped
            // (under 1% of before). It may also be the offered load falling: a move back then
            // costs little. Keeping a move that cut the rate costs a lot: seen here when the
            // frontends and both workers share two CPUs, where no worker stays saturated
            // after the move (`docs/scale.md`, placement by load).
            let after = s.packets();
            let (a, b) = (after as f64, t.before as f64);
            let fell = a < b * (1.0 - self.cfg.max_loss);
            let stopped = a < b / 100.0;
            if fell && !stopped {
                self.pinned.insert(t.port, now + self.cfg.cooldown * 10);
                self.quiet_until = Some(now + self.cfg.cooldown);
                return Decision::Undo {
                    port: t.port,
                    from: t.to,
                    to: t.from,
                    rate: (t.before, after),
                };
            }
        }
        if !self.cfg.enabled {
            return Decision::Stay;
        }
        let Some(d) = self.plan(s) else {
            return Decision::Stay;
        };
        if let Decision::Move { port, from, to, .. } = d {
            self.trial = Some(Trial {
                port,
                from,
                to,
                before: s.packets(),
            });
            self.quiet_until = Some(now + self.cfg.cooldown);
            self.hot_for.iter_mut().for_each(|h| *h = 0);
        }
        d
    }

    /// A move or undo the caller could not make: forget it (the port stays put a while).
    pub(crate) fn failed(&mut self, port: PortId, now: Instant) {
        if self.trial.is_some_and(|t| t.port == port) {
            self.trial = None;
        }
        self.pinned.insert(port, now + self.cfg.cooldown * 10);
    }

    /// The best single move off a shard saturated for long enough, if it gains enough.
    fn plan(&self, s: &Sample) -> Option<Decision> {
        let hot = (0..self.hot_for.len())
            .filter(|&k| self.hot_for[k] >= self.cfg.sustain)
            .max_by(|&a, &b| s.busy_of(a).total_cmp(&s.busy_of(b)))?;
        let cool = (0..s.busy.len().min(self.hot_for.len()))
            .filter(|&k| k != hot)
            .min_by(|&a, &b| s.busy_of(a).total_cmp(&s.busy_of(b)))?;
        let on_hot: u64 = s
            .ports
            .iter()
            .filter(|p| p.shard == hot)
            .map(|p| p.packets)
            .sum();
        if on_hot == 0 {
            return None;
        }
        let (bh, bc) = (s.busy_of(hot), s.busy_of(cool));
        let best = s
            .ports
            .iter()
            .filter(|p| {
                p.shard == hot && p.movable && p.packets > 0 && !self.pinned.contains_key(&p.id)
            })
            .map(|p| (p.id, bh * p.packets as f64 / on_hot as f64))
            // Room on the other worker is worth something only with a CPU to run it: where
            // the frontends use every CPU, a busier second worker takes theirs. At least
            // half a CPU to spare, and the port's cost (one interval's idle share is noisy).
            .filter(|&(_, cost)| cost.max(0.5) <= s.spare_cpus)
            .map(|(id, cost)| (id, bh - cost, bc + cost))
            .min_by(|a, b| a.1.max(a.2).total_cmp(&b.1.max(b.2)))?;
        let after = best.1.max(best.2);
        (after <= bh - self.cfg.min_gain).then_some(Decision::Move {
            port: best.0,
            from: hot,
            to: cool,
            busy: (best.1, best.2),
        })
    }
}

/// The shard a new port goes to: the least busy; among those within 5 points of it, the
/// one with the fewest ports; then the lowest index.
pub(crate) fn least_loaded(busy: &[f64], ports: &[usize]) -> usize {
    let n = busy.len().max(ports.len()).max(1);
    let b = |k: usize| busy.get(k).copied().unwrap_or(0.0);
    let floor = (0..n).map(b).fold(f64::INFINITY, f64::min);
    (0..n)
        .filter(|&k| b(k) <= floor + 0.05)
        .min_by_key(|&k| (ports.get(k).copied().unwrap_or(0), k))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(id: PortId, shard: usize, packets: u64) -> PortLoad {
        PortLoad {
            id,
            shard,
            packets,
            movable: true,
        }
    }

    fn cfg() -> RebalanceConfig {
        RebalanceConfig::default()
    }

    fn sample(busy: &[f64], ports: Vec<PortLoad>) -> Sample {
        Sample {
            busy: busy.to_vec(),
            ports,
            ..Sample::default()
        }
    }

    fn stays(d: &Decision) -> bool {
        *d == Decision::Stay
    }

    /// Steps the balancer once a second from `t0` over the same sample, `n` times; the
    /// decisions.
    fn run(b: &mut Balancer, s: &Sample, t0: Instant, from: u64, n: u64) -> Vec<Decision> {
        (from..from + n)
            .map(|i| b.step(s, t0 + Duration::from_secs(i)))
            .collect()
    }

    #[test]
    fn a_saturated_shard_gives_a_port_to_an_idle_one_after_the_sustain_time() {
        let t0 = Instant::now();
        let mut b = Balancer::new(cfg(), 2);
        let s = sample(
            &[1.0, 0.1],
            vec![port(0, 0, 600), port(2, 0, 400), port(1, 1, 10)],
        );
        let d = run(&mut b, &s, t0, 0, 3);
        assert_eq!(&d[..2], &[Decision::Stay, Decision::Stay]);
        // Moving port 2 (0.4 of shard 0's work) leaves 0.6 and 0.5: better than moving
        // port 0 (0.4 and 0.7).
        let Decision::Move {
            port: 2,
            from: 0,
            to: 1,
            busy,
        } = d[2]
        else {
            panic!("expected port 2 to move: {:?}", d[2]);
        };
        assert!((busy.0 - 0.6).abs() < 1e-9 && (busy.1 - 0.5).abs() < 1e-9);
        // Nothing else moves during the cooldown, even if the shard stays saturated.
        assert!(run(&mut b, &s, t0, 3, 9).iter().all(stays));
    }

    #[test]
    fn no_move_without_a_spare_cpu_to_run_it() {
        let t0 = Instant::now();
        let s = Sample {
            busy: vec![1.0, 0.0],
            ports: vec![port(0, 0, 500), port(2, 0, 500)],
            spare_cpus: 0.3,
        };
        let mut b = Balancer::new(cfg(), 2);
        assert!(run(&mut b, &s, t0, 0, 10).iter().all(stays));
        // Half a CPU to spare: a port costing half of a saturated worker may go.
        let s = Sample {
            spare_cpus: 0.5,
            ..s
        };
        let mut b = Balancer::new(cfg(), 2);
        assert!(matches!(
            run(&mut b, &s, t0, 0, 3)[2],
            Decision::Move { .. }
        ));
    }

    #[test]
    fn one_port_that_fills_a_shard_alone_stays() {
        let t0 = Instant::now();
        let mut b = Balancer::new(cfg(), 2);
        let s = sample(&[1.0, 0.0], vec![port(0, 0, 1000), port(2, 0, 0)]);
        assert!(run(&mut b, &s, t0, 0, 20).iter().all(stays));
    }

    #[test]
    fn no_move_without_room_or_when_saturation_is_not_sustained() {
        let t0 = Instant::now();
        // Both shards saturated: no room.
        let mut b = Balancer::new(cfg(), 2);
        let full = sample(
            &[1.0, 0.97],
            vec![port(0, 0, 500), port(2, 0, 500), port(1, 1, 900)],
        );
        assert!(run(&mut b, &full, t0, 0, 10).iter().all(stays));
        // Saturated two intervals in three, never three running.
        let mut b = Balancer::new(cfg(), 2);
        let hot = sample(&[1.0, 0.1], vec![port(0, 0, 500), port(2, 0, 500)]);
        let calm = Sample {
            busy: vec![0.5, 0.1],
            ..hot.clone()
        };
        for i in 0..12 {
            let s = if i % 3 == 2 { &calm } else { &hot };
            assert_eq!(
                b.step(s, t0 + Duration::from_secs(i)),
                Decision::Stay,
                "{i}"
            );
        }
        // Disabled: placement only.
        let mut b = Balancer::new(
            RebalanceConfig {
                enabled: false,
                ..cfg()
            },
            2,
        );
        assert!(run(&mut b, &hot, t0, 0, 10).iter().all(stays));
    }

    #[test]
    fn a_move_that_lowers_the_rate_is_undone_and_the_port_stays_put() {
        let t0 = Instant::now();
        let mut b = Balancer::new(cfg(), 2);
        let before = sample(&[1.0, 0.0], vec![port(0, 0, 500), port(2, 0, 500)]);
        let d = run(&mut b, &before, t0, 0, 3);
        assert!(matches!(d[2], Decision::Move { port: 0, .. }), "{d:?}");
        // After the move the switch moves fewer packets (the pair now crosses workers).
        let after = sample(&[1.0, 1.0], vec![port(0, 1, 400), port(2, 0, 400)]);
        let d = run(&mut b, &after, t0, 3, 10);
        assert!(d[..9].iter().all(|d| *d == Decision::Stay), "{d:?}");
        assert_eq!(
            d[9],
            Decision::Undo {
                port: 0,
                from: 1,
                to: 0,
                rate: (1000, 800)
            }
        );
        // Back where it was, saturated again: port 0 is pinned, port 2 may go (after the
        // cooldown and the sustain time).
        let d = run(&mut b, &before, t0, 13, 14);
        let moves: Vec<_> = d
            .iter()
            .filter(|d| matches!(d, Decision::Move { .. }))
            .collect();
        assert!(
            matches!(moves[..], [Decision::Move { port: 2, .. }]),
            "{d:?}"
        );
    }

    #[test]
    fn a_move_followed_by_silence_stays_and_one_followed_by_a_lower_rate_is_undone() {
        let t0 = Instant::now();
        let before = sample(&[1.0, 0.0], vec![port(0, 0, 500), port(2, 0, 500)]);
        // The senders stopped: the rate fell to nothing.
        let mut b = Balancer::new(cfg(), 2);
        run(&mut b, &before, t0, 0, 3);
        let silent = sample(&[0.0, 0.0], vec![port(0, 1, 0), port(2, 0, 0)]);
        assert!(run(&mut b, &silent, t0, 3, 30).iter().all(stays));
        // No shard saturated after the move, yet the switch moves half as much (the workers
        // now share CPUs with the frontends): undone.
        let mut b = Balancer::new(cfg(), 2);
        run(&mut b, &before, t0, 0, 3);
        let worse = sample(&[0.6, 0.7], vec![port(0, 1, 250), port(2, 0, 250)]);
        let d = run(&mut b, &worse, t0, 3, 10);
        assert!(matches!(d[9], Decision::Undo { port: 0, .. }), "{d:?}");
    }

    #[test]
    fn a_move_that_keeps_the_rate_stays() {
        let t0 = Instant::now();
        let mut b = Balancer::new(cfg(), 2);
        let before = sample(&[1.0, 0.0], vec![port(0, 0, 500), port(2, 0, 500)]);
        run(&mut b, &before, t0, 0, 3);
        let after = sample(&[0.6, 0.6], vec![port(0, 1, 700), port(2, 0, 700)]);
        assert!(run(&mut b, &after, t0, 3, 30).iter().all(stays));
        assert!(b.trial.is_none(), "judged and kept");
    }

    #[test]
    fn new_ports_go_to_the_least_busy_shard_then_the_emptiest() {
        assert_eq!(least_loaded(&[0.0, 0.0], &[0, 0]), 0);
        assert_eq!(least_loaded(&[0.0, 0.0], &[1, 0]), 1);
        assert_eq!(least_loaded(&[0.0, 0.0], &[1, 1]), 0);
        // Busy beats empty.
        assert_eq!(least_loaded(&[0.9, 0.2], &[1, 5]), 1);
        // Within 5 points counts as equally busy.
        assert_eq!(least_loaded(&[0.22, 0.2], &[1, 5]), 0);
        assert_eq!(least_loaded(&[], &[]), 0);
    }
}
