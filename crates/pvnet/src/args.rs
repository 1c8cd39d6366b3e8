//! The flags the commands share, one name per concept: the groups flattened into each command
//! (`#[command(flatten)]`), the old names that still parse (hidden, with a warning on stderr),
//! and the rendering of a command's arguments back into a command line, which is how
//! `pvnet bench` starts its children: a renamed flag is a renamed field, and the code that
//! builds a child's command line stops compiling.

use clap::{ArgMatches, Args, Command, ValueEnum};
use pvnet_dataplane::Policy;
use pvnet_vhost::frontend::{GrantMode, RxBuffers};
use std::fmt;
use std::path::PathBuf;

/// How a polling thread runs: where, how it waits on an empty ring, and how much it takes
/// from a ring at a time (`pvnet switch`, `backend` and `frontend`).
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct PollArgs {
    /// Pin to this CPU: the frontend's thread, or the dataplane's first worker (worker k to
    /// the k-th CPU after it).
    #[arg(long)]
    pub cpu: Option<usize>,
    /// When to poll an empty ring and when to arm its notifications and sleep (a backend's
    /// transmit rings; a frontend's wait for received frames, or for room in a full TX ring):
    /// adaptive (the default: a learned, time-bounded polling window), notify (arm at once),
    /// timer:<us> (never armed, drained every period), spin:<n> (arm after n empty polls),
    /// busy (never sleep), coalesce:<us> (adaptive, but a steady stream is drained once per
    /// period with notifications off instead of polled: the period lasts while half the ring
    /// fills at the measured rate, at most <us>; CPU follows the load, for up to <us> more
    /// latency).
    #[arg(long)]
    pub policy: Option<Policy>,
    /// Most frames taken from or given to one ring at a time (a burst): one publish, one
    /// fence and at most one notification per burst; the fence waits for the burst's stores
    /// to drain, so fewer, larger bursts pay it less often (docs/bench.md). Default 64.
    #[arg(long)]
    pub batch: Option<u16>,
}

impl PollArgs {
    /// `--batch` unless given.
    pub const BATCH: u16 = 64;

    /// The policy, adaptive unless given.
    pub fn policy(&self) -> Policy {
        self.policy.unwrap_or(Policy::Adaptive)
    }

    /// The batch, [`Self::BATCH`] unless given.
    pub fn batch(&self) -> u16 {
        self.batch.unwrap_or(Self::BATCH)
    }
}

/// The dataplane's threads (`pvnet switch` and `pvnet backend`).
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct DataplaneArgs {
    #[command(flatten)]
    pub poll: PollArgs,
    /// Dataplane worker threads, 1 to 64 (default 1), each polling only its own ports. The
    /// switch puts a new port on the least busy one (then the one with the fewest ports),
    /// and a packet between ports of two workers crosses a ring between them (one more
    /// copy); the backend spreads frontends over them by port id (a forwarding pair stays
    /// together).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The polling policy of receive rings while they wait for the frontend's buffers
    /// (values as --policy). Default adaptive.
    #[arg(long)]
    pub rx_policy: Option<Policy>,
    /// Microseconds a transmit-completion call may be held back so that the completions of
    /// that time take one interrupt (like a NIC's tx-usecs; at least two wake-ups). Default
    /// 150.
    #[arg(long)]
    pub tx_call_delay: Option<u64>,
}

impl DataplaneArgs {
    /// `--tx-call-delay` unless given, microseconds.
    pub const TX_CALL_DELAY_US: u64 = 150;
}

/// The traffic of a run (`pvnet backend`'s generator, `frontend` and `bench`).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct TrafficArgs {
    /// Ethernet frame length in bytes, virtio-net header not included (64 and 1500 are the
    /// reference sizes). `pvnet frontend --role tx` also takes MIN-MAX: each frame's length
    /// drawn uniformly over MIN..=MAX from a fixed-seed PRNG (every frame still numbered; the
    /// same sequence of lengths every run).
    #[arg(long, default_value = "64", value_parser = parse_sizes)]
    pub frame_len: Sizes,
    /// Seconds of traffic: a frontend sends (tx), runs (rr, drop, echo) or stays connected
    /// (idle) this long; a backend's generator sends this long once a frontend's receive
    /// queue starts; `pvnet bench` runs each scenario this long.
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
}

impl Default for TrafficArgs {
    fn default() -> Self {
        Self {
            frame_len: Sizes::one(64),
            secs: 2.0,
        }
    }
}

/// The virtqueues of pvnet's frontend (`pvnet frontend`, and `pvnet bench` for its
/// frontends).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct RingArgs {
    /// Descriptors per queue (a power of two).
    #[arg(long, default_value_t = RingArgs::QUEUE_SIZE)]
    pub queue_size: u16,
    /// Ask for the packed virtqueue (VIRTIO_F_RING_PACKED, virtio 1.1) instead of the split
    /// one; split if the backend does not offer it (a frontend's `ready` line shows what was
    /// negotiated).
    #[arg(long)]
    pub packed: bool,
    /// Put the device behind an IOMMU (VIRTIO_F_ACCESS_PLATFORM) and grant it buffers: `off`
    /// (no IOMMU), `per-packet` (each buffer granted with an IOTLB update before it is posted
    /// and revoked when it returns, each acked: a guest's iommu.strict=1) or `pool` (rings
    /// and buffer pools granted once: staging grants).
    #[arg(long, default_value = "off")]
    pub grants: GrantMode,
}

impl RingArgs {
    /// `--queue-size` unless given.
    pub const QUEUE_SIZE: u16 = 256;
}

impl Default for RingArgs {
    fn default() -> Self {
        Self {
            queue_size: Self::QUEUE_SIZE,
            packed: false,
            grants: GrantMode::Off,
        }
    }
}

/// Frame lengths of a run: one length (`min == max`) or a uniform mix over `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sizes {
    /// Shortest frame.
    pub min: usize,
    /// Longest frame.
    pub max: usize,
}

impl Sizes {
    /// Every frame `len` bytes.
    pub fn one(len: usize) -> Self {
        Self { min: len, max: len }
    }

    /// The one length, or None for a mix.
    pub fn single(self) -> Option<usize> {
        (self.min == self.max).then_some(self.min)
    }
}

impl fmt::Display for Sizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.single() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "{}-{}", self.min, self.max),
        }
    }
}

/// `N` or `MIN-MAX`.
fn parse_sizes(s: &str) -> Result<Sizes, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<usize>()
            .map_err(|e| format!("`{t}`: {e} (expected N or MIN-MAX)"))
    };
    let (min, max) = match s.split_once('-') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => (num(s)?, num(s)?),
    };
    if min > max {
        return Err(format!("{min}-{max}: MIN is larger than MAX"));
    }
    Ok(Sizes { min, max })
}

// ---------------------------------------------------------------------------------------
// Old names.

/// A flag renamed so that one concept has one name in every command. The old name still
/// parses (a hidden alias of the new flag, in that command only) and draws a warning.
#[derive(Debug, PartialEq, Eq)]
pub struct Renamed {
    /// The command it belongs to, as subcommand names under `pvnet`.
    pub path: &'static [&'static str],
    /// The old name, without `--`.
    pub old: &'static str,
    /// The new name, without `--`.
    pub new: &'static str,
}

/// Every renamed flag (issue 35: the CLI speaks one language).
pub const RENAMED: &[Renamed] = &[
    Renamed {
        path: &["backend"],
        old: "shards",
        new: "workers",
    },
    Renamed {
        path: &["backend"],
        old: "gen-secs",
        new: "secs",
    },
    Renamed {
        path: &["frontend"],
        old: "poll",
        new: "policy",
    },
    Renamed {
        path: &["frontend"],
        old: "burst",
        new: "batch",
    },
    Renamed {
        path: &["frontend"],
        old: "paced-bursts",
        new: "paced-batches",
    },
    Renamed {
        path: &["bench"],
        old: "size",
        new: "frame-len",
    },
    Renamed {
        path: &["bench", "sweep"],
        old: "size",
        new: "frame-len",
    },
    Renamed {
        path: &["switch"],
        old: "duration",
        new: "secs",
    },
    Renamed {
        path: &["ctl"],
        old: "socket",
        new: "ctl-socket",
    },
];

/// `cmd` (the whole `pvnet` command) with every old name of [`RENAMED`] a hidden alias of
/// its new flag.
pub fn with_old_names(cmd: Command) -> Command {
    RENAMED.iter().fold(cmd, |cmd, r| alias_in(cmd, r.path, r))
}

fn alias_in(cmd: Command, path: &[&str], r: &Renamed) -> Command {
    if let Some((first, rest)) = path.split_first() {
        return cmd.mut_subcommand(*first, |s| alias_in(s, rest, r));
    }
    let id = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(r.new))
        .map(|a| a.get_id().clone());
    match id {
        Some(id) => cmd.mut_arg(id, |a| a.alias(r.old)),
        None => cmd,
    }
}

/// The names of the subcommands a parse ended in, outermost first (`["bench", "sweep"]`).
pub fn subcommand_path(m: &ArgMatches) -> Vec<String> {
    let mut path = Vec::new();
    let mut m = m;
    while let Some((name, sub)) = m.subcommand() {
        path.push(name.to_owned());
        m = sub;
    }
    path
}

/// The renamed flags among `argv` (the program name first) that the subcommands `path` take,
/// each once. `argv` parsed, so every `--name` token before a `--` is a flag (clap takes no
/// value that starts with `--` here).
pub fn old_names_used(argv: &[String], path: &[String]) -> Vec<&'static Renamed> {
    let mut used: Vec<&'static Renamed> = Vec::new();
    for tok in argv.iter().skip(1).take_while(|t| t.as_str() != "--") {
        let Some(name) = tok.strip_prefix("--") else {
            continue;
        };
        let name = name.split_once('=').map_or(name, |(n, _)| n);
        let applies = |r: &Renamed| {
            r.old == name
                && path.len() >= r.path.len()
                && r.path.iter().zip(path).all(|(a, b)| a == b)
        };
        if let Some(r) = RENAMED.iter().find(|r| applies(r)) {
            if !used.iter().any(|u| u.old == r.old) {
                used.push(r);
            }
        }
    }
    used
}

// ---------------------------------------------------------------------------------------
// Arguments back into a command line.

/// A flag's name from the field clap derives it from: `frame_len` -> `--frame-len`.
pub fn flag(field: &str) -> String {
    format!("--{}", field.replace('_', "-"))
}

/// A value that can be written back onto a command line as its flag's argument.
pub trait ArgValue {
    /// Appends `flag` and the value (a bool: the flag alone if true; None: nothing).
    fn push_to(&self, flag: String, out: &mut Vec<String>);
}

macro_rules! display_arg {
    ($($t:ty),* $(,)?) => {
        $(impl ArgValue for $t {
            fn push_to(&self, flag: String, out: &mut Vec<String>) {
                out.push(flag);
                out.push(self.to_string());
            }
        })*
    };
}

display_arg!(u8, u16, u32, u64, usize, f64, String, Policy, GrantMode, RxBuffers, Sizes);

impl ArgValue for PathBuf {
    fn push_to(&self, flag: String, out: &mut Vec<String>) {
        out.push(flag);
        out.push(self.to_string_lossy().into_owned());
    }
}

impl ArgValue for bool {
    fn push_to(&self, flag: String, out: &mut Vec<String>) {
        if *self {
            out.push(flag);
        }
    }
}

impl<T: ArgValue> ArgValue for Option<T> {
    fn push_to(&self, flag: String, out: &mut Vec<String>) {
        if let Some(v) = self {
            v.push_to(flag, out);
        }
    }
}

/// Appends `flag` and a value enum's name (as clap parses it).
pub fn push_value_enum<E: ValueEnum>(v: &E, flag: String, out: &mut Vec<String>) {
    if let Some(p) = v.to_possible_value() {
        out.push(flag);
        out.push(p.get_name().to_owned());
    }
}

/// Implements [`ArgValue`] for clap value enums (by the name clap parses).
macro_rules! value_enum_arg {
    ($($t:ty),* $(,)?) => {
        $(impl $crate::args::ArgValue for $t {
            fn push_to(&self, flag: String, out: &mut Vec<String>) {
                $crate::args::push_value_enum(self, flag, out);
            }
        })*
    };
}
pub(crate) use value_enum_arg;

/// Appends each field (a local binding named as the field, e.g. from destructuring `self`)
/// as `--<field> <value>`: the flag's name comes from the field's, as clap derives it.
macro_rules! push_args {
    ($out:expr; $($field:ident),* $(,)?) => {
        {
            use $crate::args::ArgValue as _;
            $($field.push_to($crate::args::flag(stringify!($field)), $out);)*
        }
    };
}
pub(crate) use push_args;

/// A flag group written back as arguments.
pub trait ToArgs {
    /// Appends every field's flag and value.
    fn push_args(&self, out: &mut Vec<String>);
}

impl ToArgs for PollArgs {
    fn push_args(&self, out: &mut Vec<String>) {
        let Self { cpu, policy, batch } = self;
        push_args!(out; cpu, policy, batch);
    }
}

impl ToArgs for DataplaneArgs {
    fn push_args(&self, out: &mut Vec<String>) {
        let Self {
            poll,
            workers,
            rx_policy,
            tx_call_delay,
        } = self;
        poll.push_args(out);
        push_args!(out; workers, rx_policy, tx_call_delay);
    }
}

impl ToArgs for TrafficArgs {
    fn push_args(&self, out: &mut Vec<String>) {
        let Self { frame_len, secs } = self;
        push_args!(out; frame_len, secs);
    }
}

impl ToArgs for RingArgs {
    fn push_args(&self, out: &mut Vec<String>) {
        let Self {
            queue_size,
            packed,
            grants,
        } = self;
        push_args!(out; queue_size, packed, grants);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print_back() {
        for s in ["64", "60-1514"] {
            assert_eq!(parse_sizes(s).unwrap().to_string(), s);
        }
        assert_eq!(parse_sizes("64").unwrap().single(), Some(64));
        assert!(parse_sizes("100-60").is_err());
        assert!(parse_sizes("x").is_err());
    }

    #[test]
    fn old_names_are_found_in_their_command_only() {
        let argv = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let path = |s: &[&str]| s.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
        let used = old_names_used(
            &argv("pvnet backend --socket /s --shards=2 --gen-secs 1 --shards 3"),
            &path(&["backend"]),
        );
        let names: Vec<_> = used.iter().map(|r| (r.old, r.new)).collect();
        assert_eq!(names, [("shards", "workers"), ("gen-secs", "secs")]);
        // `--socket` is current in `pvnet frontend`, old in `pvnet ctl`.
        assert!(
            old_names_used(&argv("pvnet frontend --socket /s"), &path(&["frontend"])).is_empty()
        );
        assert_eq!(
            old_names_used(
                &argv("pvnet ctl port del --socket /s x"),
                &path(&["ctl", "port", "del"])
            )[0]
            .new,
            "ctl-socket"
        );
        // After `--`, nothing is a flag.
        assert!(old_names_used(&argv("pvnet bench -- --size"), &path(&["bench"])).is_empty());
        assert_eq!(
            old_names_used(
                &argv("pvnet bench --size 64 sweep --size 64"),
                &path(&["bench", "sweep"])
            )
            .len(),
            1
        );
    }
}
