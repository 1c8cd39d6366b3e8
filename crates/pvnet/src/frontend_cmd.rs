//! `pvnet frontend`: pvnet's virtio-net driver as a traffic source, sink or request/response
//! client.
//!
//! Output on stdout is JSON lines: `{"ready":..}` once the queues run, `{"progress":..}` about
//! four times a second, and `{"final":..}` at the end (the bench reads them).
//!
//! Idle handling uses the same per-queue [`Poller`] as the backend: poll an empty ring while
//! the policy says so, then arm, fence, re-check, and only then sleep on the call eventfd.

use crate::args::{self, PollArgs, RingArgs, Sizes, ToArgs, TrafficArgs};
use crate::error::{failed, usage, Result};
use crate::limits::pin_current_thread;
use crate::proc;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use pvnet_dataplane::frame::{self, SeqCheck};
use pvnet_dataplane::{Idle, Poller, WakeCost};
use pvnet_vhost::frontend::{
    ClientConfig, NetClient, RxBuffers, RxFrame, TxMode, DEFAULT_HEADROOM,
};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use virtq::Armed;

/// What the frontend does.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum FrontRole {
    /// Send numbered frames for --secs (as fast as the ring allows, or at --rate), then an
    /// end marker.
    Tx,
    /// Receive and check numbered frames until the end marker.
    Rx,
    /// Request/response against `pvnet backend --role echo`, or through a switch against
    /// `pvnet frontend --role echo --announce`: --flows requests in flight, each answered
    /// one starts the next; latency percentiles from a histogram.
    Rr,
    /// Connect, post receive buffers, and sleep for --secs (idle CPU check).
    Idle,
    /// Receive any frames for --secs and drop them after reading the Ethernet header (in
    /// place, or from a copy: --rx-mode), an XDP_DROP-like sink; reports the rate, the
    /// buffers and memory per frame, and CPU ns per frame.
    Drop,
    /// As drop (paced by --rate too), and answer every request of `--role rr` (addresses
    /// swapped): the far end of a request/response flow through a switch, sharing its
    /// egress with whatever else is sent to it. Reports each request's one-way delay, from
    /// the rr client's send to this take (`request_p50_us`, `request_p99_us`, ...).
    Echo,
}

/// How `--role rx` reads a frame.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum RxMode {
    /// Look at the frame where it arrived: only the bench header is read, through the
    /// in-place view, and the buffers go back to the ring (an XDP_DROP-like sink).
    Inplace,
    /// Copy every byte of the frame out into a buffer of our own first, as a `read` into an
    /// application buffer does, then look at the copy.
    Copy,
}

/// TX completion mode (see `pvnet_vhost::frontend::TxMode`).
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum TxModeArg {
    /// TX interrupts off, reclaim from the send path, arm only when the ring is full.
    Napi,
    /// Reclaim only on transmit, never a TX interrupt (a full ring is polled).
    Xmit,
    /// TX interrupts always on.
    Irq,
    /// Reclaim TX completions from the RX poll; arm TX only when full.
    Rx,
}

/// `pvnet frontend` arguments.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct FrontendArgs {
    /// vhost-user socket of the backend.
    #[arg(long)]
    pub socket: PathBuf,
    /// Role.
    #[arg(long, value_enum, default_value_t = FrontRole::Tx)]
    pub role: FrontRole,
    #[command(flatten)]
    pub traffic: TrafficArgs,
    /// tx: send exactly this many numbered frames, then the end marker (--secs is then not
    /// a bound). 0: send for --secs.
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// tx: frames per second to offer, evenly paced (0: as fast as the ring allows). drop:
    /// frames per second to take at most, a receiver slower than its sender (0: all that
    /// arrive); what it has not taken stays in its ring, so a backlog forms in front of it.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// tx and drop with --rate: send or take whole batches of --batch frames, sleeping until
    /// each batch is due, instead of frame by frame (a paced frontend then leaves its CPU
    /// free between batches, so that two of them can share one CPU).
    #[arg(long)]
    pub paced_batches: bool,
    /// rr: requests in flight (one per flow).
    #[arg(long, default_value_t = 1)]
    pub flows: u16,
    #[command(flatten)]
    pub ring: RingArgs,
    #[command(flatten)]
    pub poll: PollArgs,
    /// How transmitted buffers are reclaimed.
    #[arg(long, value_enum, default_value_t = TxModeArg::Napi)]
    pub tx_mode: TxModeArg,
    /// rx: give up if no frame arrives for this many seconds.
    #[arg(long, default_value_t = 30.0)]
    pub idle_timeout: f64,
    /// Disable VIRTIO_F_EVENT_IDX (use flag-based suppression).
    #[arg(long)]
    pub no_event_idx: bool,
    /// Negotiate neither VIRTIO_F_VERSION_1 nor VIRTIO_NET_F_MRG_RXBUF, like a legacy driver:
    /// every packet then carries the 10-byte virtio-net header instead of 12.
    #[arg(long)]
    pub legacy_hdr: bool,
    /// Receive buffers: `ewma` (sized from an EWMA of the frames received, weight 1/64, carved
    /// from 4 KiB chunks; the floor keeps room for the largest frame in a full ring) or
    /// `fixed:<bytes>` (every buffer offers that many bytes, header included).
    #[arg(long, default_value = "ewma")]
    pub rx_buffers: RxBuffers,
    /// Bytes kept free in front of every received frame for growing it in place (rounded up
    /// to 64).
    #[arg(long, default_value_t = DEFAULT_HEADROOM)]
    pub rx_headroom: u32,
    /// rx: how each frame is read (in place, or copied out first).
    #[arg(long, value_enum, default_value_t = RxMode::Inplace)]
    pub rx_mode: RxMode,
    /// Take TCP segmentation offload on receive (GUEST_CSUM, GUEST_TSO4/6): the backend may
    /// then send frames of up to 64 KiB, and the receive buffers are sized for them.
    #[arg(long)]
    pub guest_tso: bool,
    /// rx, drop and echo: first send one broadcast frame from the address tx and rr frames
    /// go to (02:00:00:00:00:04), as a guest's gratuitous ARP does, so that a learning
    /// switch delivers them to this port alone instead of flooding them.
    #[arg(long)]
    pub announce: bool,
}

args::value_enum_arg!(FrontRole, RxMode, TxModeArg);

impl FrontendArgs {
    /// A frontend on `socket` in `role`, everything else as its defaults.
    pub fn new(socket: PathBuf, role: FrontRole) -> Self {
        Self {
            socket,
            role,
            traffic: TrafficArgs::default(),
            count: 0,
            rate: 0,
            paced_batches: false,
            flows: 1,
            ring: RingArgs::default(),
            poll: PollArgs::default(),
            tx_mode: TxModeArg::Napi,
            idle_timeout: 30.0,
            no_event_idx: false,
            legacy_hdr: false,
            rx_buffers: RxBuffers::Ewma,
            rx_headroom: DEFAULT_HEADROOM,
            rx_mode: RxMode::Inplace,
            guest_tso: false,
            announce: false,
        }
    }

    /// The command line that runs this frontend: `frontend --socket ... --role ...`.
    pub fn command_line(&self) -> Vec<String> {
        let Self {
            socket,
            role,
            traffic,
            count,
            rate,
            paced_batches,
            flows,
            ring,
            poll,
            tx_mode,
            idle_timeout,
            no_event_idx,
            legacy_hdr,
            rx_buffers,
            rx_headroom,
            rx_mode,
            guest_tso,
            announce,
        } = self;
        let mut out = vec!["frontend".to_owned()];
        args::push_args!(&mut out; socket, role);
        traffic.push_args(&mut out);
        args::push_args!(&mut out; count, rate, paced_batches, flows);
        ring.push_args(&mut out);
        poll.push_args(&mut out);
        args::push_args!(&mut out; tx_mode, idle_timeout, no_event_idx, legacy_hdr, rx_buffers,
            rx_headroom, rx_mode, guest_tso, announce);
        out
    }

    /// Frames per burst (at least 1).
    fn batch(&self) -> usize {
        usize::from(self.poll.batch()).max(1)
    }
}

/// The address tx frames are sent from, and to (and rr requests to).
const TX_SRC: [u8; 6] = [2, 0, 0, 0, 0, 3];
const TX_DST: [u8; 6] = [2, 0, 0, 0, 0, 4];
/// The address rr requests are sent from.
const RR_SRC: [u8; 6] = [2, 0, 0, 0, 0, 5];

/// Frame lengths for the transmit loop: a fixed one, or drawn per frame from a xorshift64*
/// generator with a fixed seed (a few register operations, no allocation, no syscall).
struct LenGen {
    min: usize,
    /// `max - min + 1`, or 0 for a fixed length.
    span: u64,
    state: u64,
}

impl LenGen {
    fn new(s: Sizes) -> Self {
        let span = if s.max > s.min {
            (s.max - s.min + 1) as u64
        } else {
            0
        };
        Self {
            min: s.min,
            span,
            state: 0x9e37_79b9_7f4a_7c15,
        }
    }

    #[inline]
    fn next(&mut self) -> usize {
        if self.span == 0 {
            return self.min;
        }
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        // Multiply-shift maps the 32 random bits onto 0..span without a division.
        #[allow(clippy::cast_possible_truncation)] // < span <= 2048
        let off = ((r * self.span) >> 32) as usize;
        self.min + off
    }
}

fn emit(v: &serde_json::Value) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

/// Which ring the frontend is waiting on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ring {
    Rx,
    Tx,
}

/// One empty poll under `poller`: keep polling, or arm + re-check + sleep (bounded).
fn idle(c: &mut NetClient, p: &mut Poller, ring: Ring, now: Instant) -> Result<()> {
    let decision = match (ring, c.tx_mode()) {
        // Reclaim-on-xmit never takes a TX interrupt: a full ring is polled.
        (Ring::Tx, TxMode::Xmit) => Idle::Poll,
        _ => p.on_empty(now),
    };
    match decision {
        Idle::Poll => std::hint::spin_loop(),
        Idle::Until(t) => {
            c.wait(t.saturating_duration_since(now))?;
        }
        Idle::Arm => {
            let armed = match ring {
                Ring::Rx => c.arm_rx()?,
                Ring::Tx => c.arm_tx()?,
            };
            if armed == Armed::Empty {
                c.wait(Duration::from_millis(100))?;
            }
            match ring {
                Ring::Rx => c.disarm_rx(),
                Ring::Tx => c.disarm_tx(),
            }
            p.woke();
        }
    }
    Ok(())
}

/// Runs the frontend.
pub fn run(a: &FrontendArgs) -> Result<()> {
    proc::install_stop_handler();
    if let Some(cpu) = a.poll.cpu {
        pin_current_thread(cpu);
    }
    if !(a.traffic.secs.is_finite() && a.traffic.secs >= 0.0) {
        return Err(usage("--secs must be a non-negative number"));
    }
    let lo = frame::MIN_FRAME.max(RR_MIN);
    let hi = 2048 - 12;
    if a.role != FrontRole::Drop && (a.traffic.frame_len.min < lo || a.traffic.frame_len.max > hi) {
        return Err(usage(format!("--frame-len must be within {lo}..={hi}")));
    }
    if a.traffic.frame_len.min != a.traffic.frame_len.max && a.role != FrontRole::Tx {
        return Err(usage(
            "--frame-len MIN-MAX (mixed sizes) is for --role tx only",
        ));
    }
    let frame_len = a.traffic.frame_len.min;
    if a.flows == 0 || usize::from(a.flows) > usize::from(a.ring.queue_size) {
        return Err(usage("--flows must be within 1..=queue size"));
    }
    let tx_mode = match a.tx_mode {
        TxModeArg::Napi => TxMode::Napi,
        TxModeArg::Xmit => TxMode::Xmit,
        TxModeArg::Irq => TxMode::Irq,
        TxModeArg::Rx => TxMode::RxPoll,
    };
    let cfg = ClientConfig {
        queue_size: a.ring.queue_size,
        buf_size: 2048,
        event_idx: !a.no_event_idx,
        tx_mode,
        legacy_hdr: a.legacy_hdr,
        rx_buffers: a.rx_buffers,
        rx_headroom: a.rx_headroom,
        guest_tso: a.guest_tso,
        packed: a.ring.packed,
        grants: a.ring.grants,
        ..ClientConfig::default()
    };
    let wake = WakeCost::measure(30);
    let mut c = NetClient::connect(&a.socket, cfg)?;
    emit(&json!({ "ready": { "features": format!("{:#x}", c.features()) } }));
    let r = match a.role {
        FrontRole::Tx => tx(&mut c, a, Poller::new(a.poll.policy(), wake))?,
        FrontRole::Rx => rx(&mut c, a, Poller::new(a.poll.policy(), wake))?,
        FrontRole::Rr => rr(&mut c, a, frame_len, Poller::new(a.poll.policy(), wake))?,
        FrontRole::Drop => drop_all(&mut c, a, Poller::new(a.poll.policy(), wake), false)?,
        FrontRole::Echo => drop_all(&mut c, a, Poller::new(a.poll.policy(), wake), true)?,
        FrontRole::Idle => {
            let until = Instant::now() + Duration::from_secs_f64(a.traffic.secs);
            while Instant::now() < until && !proc::stopping() {
                if c.arm_rx()? == Armed::Empty {
                    c.wait(until.saturating_duration_since(Instant::now()))?;
                }
                c.recv_burst(usize::MAX, |_| {})?;
            }
            json!({})
        }
    };
    c.stop()?;
    let s = c.stats;
    let mut out = json!({
        "tx_packets": s.tx_packets, "rx_packets": s.rx_packets, "rx_errors": s.rx_errors,
        "kicks": s.kicks, "calls": s.calls, "sleeps": s.sleeps,
        "rx_bytes": s.rx_bytes, "rx_buffers": s.rx_buffers, "rx_truesize": s.rx_truesize,
        "cpu_ns": proc::cpu_time_of(std::process::id()).map_or(0, |d| d.as_nanos()),
    });
    if let (Some(o), Some(r)) = (out.as_object_mut(), r.as_object()) {
        o.extend(r.clone());
    }
    if let Some(g) = c.grant_stats() {
        out["iotlb"] = json!({
            "updates": g.updates, "invalidates": g.invalidates,
            "misses_answered": g.misses_answered, "misses_refused": g.misses_refused,
        });
    }
    emit(&json!({ "final": out }));
    if out["timed_out"].as_bool() == Some(true) {
        return Err(failed(format!(
            "no frame for {:.0} s and no end marker (got {} data frames)",
            a.idle_timeout, out["data_received"]
        )));
    }
    Ok(())
}

/// Frames sent per whole second of the run, for the stability (CoV) figure.
struct Intervals {
    start: Instant,
    counts: Vec<u64>,
    last: u64,
}

impl Intervals {
    fn new(start: Instant) -> Self {
        Self {
            start,
            counts: Vec::new(),
            last: 0,
        }
    }
    fn tick(&mut self, now: Instant, total: u64) {
        let sec = now.duration_since(self.start).as_secs();
        while (self.counts.len() as u64) < sec {
            self.counts.push(total - self.last);
            self.last = total;
        }
    }
}

/// A scratch buffer for bursts and the frame template every frame is copied from.
fn template(frame_len: usize, src: [u8; 6], dst: [u8; 6]) -> (Vec<u8>, Vec<u8>) {
    let mut tpl = vec![0u8; frame_len];
    frame::write_template(&mut tpl, frame_len, src, dst);
    (vec![0u8; 2048], tpl)
}

/// Sends numbered frames for `secs` or exactly `--count` of them (paced at `--rate` if
/// given), then the end marker, then waits until the backend has consumed everything.
fn tx(c: &mut NetClient, a: &FrontendArgs, mut p: Poller) -> Result<serde_json::Value> {
    // The template has the longest length; a shorter frame is a prefix of it (zeros after
    // the header either way).
    let (mut scratch, tpl) = template(a.traffic.frame_len.max, TX_SRC, TX_DST);
    let mut lens = LenGen::new(a.traffic.frame_len);
    let mut bytes = 0u64;
    let limit = if a.count > 0 { a.count } else { u64::MAX };
    let dur = if a.count > 0 {
        Duration::MAX
    } else {
        Duration::from_secs_f64(a.traffic.secs)
    };
    let start = Instant::now();
    let pace = Pace::new(a, start);
    let mut iv = Intervals::new(start);
    let mut seq = 0u64;
    let mut next_report = start + Duration::from_millis(250);
    let burst = a.batch();
    loop {
        let now = Instant::now();
        if seq >= limit || now.duration_since(start) >= dur || proc::stopping() {
            break;
        }
        iv.tick(now, seq);
        if now >= next_report {
            emit(&json!({ "progress": { "packets": seq } }));
            next_report = now + Duration::from_millis(250);
        }
        let left = usize::try_from(limit - seq).unwrap_or(usize::MAX);
        let want = match &pace {
            None => burst.min(left),
            Some(pace) => match pace.owed(now, seq) {
                0 => continue,
                owe => owe.min(burst).min(left),
            },
        };
        let mut k = 0u64;
        let n = c.send_burst(want, &mut scratch, |_, buf| {
            let len = lens.next();
            buf[..len].copy_from_slice(&tpl[..len]);
            frame::set_seq(buf, seq + k);
            k += 1;
            bytes += len as u64;
            len
        })?;
        seq += n as u64;
        if n > 0 {
            p.on_work(now);
        } else {
            // Ring full: poll for completions while the policy says so, then arm and sleep.
            idle(c, &mut p, Ring::Tx, now)?;
        }
    }
    let whole = if a.count > 0 {
        start.elapsed().as_secs()
    } else {
        dur.as_secs()
    };
    iv.tick(start + Duration::from_secs(whole), seq);
    // End marker: retried until the ring takes it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let end_len = a.traffic.frame_len.min;
    loop {
        let n = c.send_burst(1, &mut scratch, |_, buf| {
            buf[..end_len].copy_from_slice(&tpl[..end_len]);
            frame::set_end(buf, seq);
            end_len
        })?;
        if n == 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err(failed(
                "backend stopped taking frames (end marker not queued)",
            ));
        }
        idle(c, &mut p, Ring::Tx, Instant::now())?;
    }
    // Wait for the backend to consume everything (completions), so the interval covers it.
    while c.tx_in_flight() > 0 {
        c.reclaim_tx()?;
        if c.tx_in_flight() == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(failed("backend did not complete all TX buffers"));
        }
        if c.arm_tx()? == Armed::Empty {
            c.wait(Duration::from_millis(50))?;
        }
        c.disarm_tx();
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(json!({
        "data_sent": seq, "data_bytes": bytes, "secs": secs, "intervals": iv.counts,
    }))
}

/// Sends one broadcast frame from the address tx and rr frames go to, so that a learning
/// switch learns where it is. Not a bench frame (no magic): a sink or a checking receiver
/// ignores it.
fn announce(c: &mut NetClient) -> Result<()> {
    let mut scratch = vec![0u8; 2048];
    while c.send_burst(1, &mut scratch, |_, buf| {
        buf[..64].fill(0);
        buf[0..6].copy_from_slice(&[0xff; 6]);
        buf[6..12].copy_from_slice(&TX_DST);
        64
    })? == 0
    {
        c.reclaim_tx()?;
    }
    Ok(())
}

/// Receives until the end marker; checks order and count. The interval runs from the first
/// frame to the end marker.
fn rx(c: &mut NetClient, a: &FrontendArgs, mut p: Poller) -> Result<serde_json::Value> {
    if a.announce {
        announce(c)?;
    }
    let mut check = SeqCheck::default();
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut next_report = Instant::now() + Duration::from_millis(250);
    let mut body = vec![0u8; 2048];
    let idle_timeout = Duration::from_secs_f64(a.idle_timeout);
    let mut last_frame = Instant::now();
    let mut timed_out = false;
    c.disarm_rx();
    while check.end.is_none() && !proc::stopping() {
        let mut done = false;
        let n = c.recv_burst(usize::MAX, |f| {
            let bench = match a.rx_mode {
                // Copied out whole, then looked at, as a consumer of a copying API would.
                RxMode::Copy => {
                    let n = f.read(0, &mut body);
                    frame::parse(&body[..n])
                }
                // Only the bench header, where it arrived (unless the device split it
                // across buffers).
                RxMode::Inplace => match f
                    .segments()
                    .next()
                    .and_then(|s| s.read_array::<{ frame::MIN_FRAME }>(0))
                {
                    Some(head) => frame::parse(&head),
                    None => {
                        let n = f.read(0, &mut body[..frame::MIN_FRAME]);
                        frame::parse(&body[..n])
                    }
                },
            };
            if check.feed(bench) {
                done = true;
            }
        })?;
        let now = Instant::now();
        if n > 0 {
            p.on_work(now);
            first.get_or_insert(now);
            last = now;
            last_frame = now;
            if now >= next_report {
                emit(&json!({ "progress": { "packets": check.data } }));
                next_report = now + Duration::from_millis(250);
            }
            if done {
                break;
            }
            continue;
        }
        if now.duration_since(last_frame) > idle_timeout {
            // Reported (final line, then an error exit): what arrived still counts.
            timed_out = true;
            break;
        }
        idle(c, &mut p, Ring::Rx, now)?;
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    Ok(json!({
        "data_received": check.data, "seq_errors": check.seq_errors,
        "missing": check.missing, "backward": check.backward,
        "end_count": check.end, "complete": check.complete(), "secs": secs,
        "timed_out": timed_out,
    }))
}

/// Pacing at `--rate`: frames are due evenly from `start`; a caller ahead of them sleeps.
struct Pace {
    start: Instant,
    rate: f64,
    /// Frames that must be due before the caller goes on: 1, or `--batch` with
    /// `--paced-batches`.
    batch: u64,
}

impl Pace {
    /// `None` without `--rate`.
    fn new(a: &FrontendArgs, start: Instant) -> Option<Self> {
        if a.rate == 0 {
            return None;
        }
        // Precise sleeps for pacing (the default 50 us timer slack would bunch packets).
        // SAFETY: prctl with an integer argument; affects only this thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
        let batch = if a.paced_batches { a.batch() } else { 1 };
        #[allow(clippy::cast_precision_loss)]
        Some(Self {
            start,
            rate: a.rate as f64,
            batch: batch as u64,
        })
    }

    /// Frames due by `now` beyond the `done` already handled, or 0 after sleeping until
    /// the next batch is due (when that is more than 20 us away; less is spun, as a sleep
    /// that short oversleeps).
    fn owed(&self, now: Instant, done: u64) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let due = (now.duration_since(self.start).as_secs_f64() * self.rate) as u64;
        if due >= done + self.batch {
            return usize::try_from(due - done).unwrap_or(usize::MAX);
        }
        #[allow(clippy::cast_precision_loss)]
        let next = self.start + Duration::from_secs_f64((done + self.batch) as f64 / self.rate);
        let gap = next.saturating_duration_since(Instant::now());
        if gap > Duration::from_micros(20) {
            std::thread::sleep(gap - Duration::from_micros(10));
        }
        0
    }
}

/// CLOCK_MONOTONIC in ns: one clock for every process of the machine, so that a request's
/// send time, stamped by the rr client, is read against it by the echo that takes it.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// A latency histogram in ns, 1 ns to 60 s, 3 significant digits.
fn latency_histogram() -> Result<Histogram<u64>> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| failed(format!("histogram: {e}")))
}

/// ns as us, for reports.
#[allow(clippy::cast_precision_loss)]
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// What drop and echo do with each frame they take.
struct Taker {
    mode: RxMode,
    /// Keep requests (`--role echo`).
    echo: bool,
    /// Echoing: each request's one-way delay, from the rr client's send to this take (the
    /// egress queue, the ring and this receiver's pace; not the answer's way back), for the
    /// requests whose round trip the client records.
    oneway: Histogram<u64>,
    body: Vec<u8>,
    /// Requests waiting for their answer: the frames back to back, and each one's length.
    asks: Vec<u8>,
    ask_lens: Vec<usize>,
    /// The Ethernet headers read, folded (so that the read is real).
    sum: u64,
}

impl Taker {
    /// Reads the frame's Ethernet header (in place, or from a copy of the whole frame) and,
    /// echoing, copies out a request.
    #[inline]
    fn take(&mut self, f: &RxFrame<'_>) {
        let eth = match self.mode {
            RxMode::Copy => {
                let n = f.read(0, &mut self.body);
                let mut h = [0u8; 14];
                let k = n.min(14);
                h[..k].copy_from_slice(&self.body[..k]);
                h
            }
            RxMode::Inplace => f
                .segments()
                .next()
                .and_then(|s| s.read_array::<14>(0))
                .unwrap_or([0; 14]),
        };
        self.sum = self
            .sum
            .wrapping_add(u64::from(eth[5]) + u64::from(eth[13]));
        if self.echo {
            let head = f
                .segments()
                .next()
                .and_then(|s| s.read_array::<{ frame::MIN_FRAME }>(0));
            if head.as_ref().and_then(|h| frame::kind(h)) == Some(frame::KIND_REQUEST) {
                let n = f.read(0, &mut self.body).min(2048 - 12);
                match rr_answer(&self.body[..n]) {
                    Some((_, sent)) if self.body[RR_RECORD] == 1 => {
                        let _ = self.oneway.record(mono_ns().saturating_sub(sent).max(1));
                    }
                    _ => {}
                }
                self.asks.extend_from_slice(&self.body[..n]);
                self.ask_lens.push(n);
            }
        }
    }
}

/// Receive-and-drop for `--secs` after the first frame: every frame's Ethernet header is read
/// (in place, or from a copy of the whole frame) and folded into a sum, so the read is real.
/// With `echo` (`--role echo`) requests are also copied out as they are taken and answered
/// after each receive burst (a few: one per request in flight).
fn drop_all(
    c: &mut NetClient,
    a: &FrontendArgs,
    mut p: Poller,
    echo: bool,
) -> Result<serde_json::Value> {
    if a.announce {
        announce(c)?;
    }
    let mut taker = Taker {
        mode: a.rx_mode,
        echo,
        body: vec![0u8; 65536],
        asks: Vec::new(),
        ask_lens: Vec::new(),
        sum: 0,
        oneway: latency_histogram()?,
    };
    let mut scratch = vec![0u8; 2048];
    let mut answered = 0u64;
    let mut first: Option<(Instant, u64, u64)> = None;
    let mut last = Instant::now();
    let idle_timeout = Duration::from_secs_f64(a.idle_timeout);
    let me = std::process::id();
    let cpu =
        || proc::cpu_time_of(me).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    // Time inside the receive calls that returned frames: the cost of receiving, whoever
    // sets the pace (a frontend waiting for a slower sender polls, and its CPU time counts
    // the polling too).
    let mut busy = Duration::ZERO;
    // With --rate, paced from the first frame on, at most --batch frames a receive (as a
    // NAPI poll's budget); a debt (this process descheduled) is made good burst by burst
    // without sleeping.
    let mut pace: Option<Pace> = None;
    let budget = a.batch();
    c.disarm_rx();
    while !proc::stopping() {
        let t = Instant::now();
        let most = match (&pace, &first) {
            (Some(pace), Some(_)) => match pace.owed(t, c.stats.rx_packets) {
                0 => continue,
                owe => owe.min(budget),
            },
            _ => usize::MAX,
        };
        let n = c.recv_burst(most, |f| taker.take(f))?;
        if !taker.ask_lens.is_empty() {
            answered += answer(c, &mut taker.asks, &mut taker.ask_lens, &mut scratch)?;
        }
        let now = Instant::now();
        if n > 0 {
            p.on_work(now);
            last = now;
            if first.is_some() {
                busy += now - t;
            }
            let (t0, _, _) = *first.get_or_insert_with(|| (now, c.stats.rx_packets, cpu()));
            if pace.is_none() && a.rate > 0 {
                pace = Pace::new(a, now).map(|mut p| {
                    p.start -= Duration::from_secs_f64(c.stats.rx_packets as f64 / p.rate);
                    p
                });
            }
            if now.duration_since(t0).as_secs_f64() >= a.traffic.secs {
                break;
            }
            continue;
        }
        if now.duration_since(last) > idle_timeout {
            break;
        }
        idle(c, &mut p, Ring::Rx, now)?;
    }
    let (pkts, secs, ns) = first.map_or((0, 0.0, 0), |(t0, p0, c0)| {
        (
            c.stats.rx_packets - p0,
            last.duration_since(t0).as_secs_f64(),
            cpu() - c0,
        )
    });
    Ok(json!({
        "dropped": pkts, "secs": secs, "answered": answered,
        "mpps": if secs > 0.0 { pkts as f64 / secs / 1e6 } else { 0.0 },
        "cpu_ns_per_frame": if pkts > 0 { ns as f64 / pkts as f64 } else { 0.0 },
        "busy_ns_per_frame": if pkts > 0 { busy.as_nanos() as f64 / pkts as f64 } else { 0.0 },
        "sum": taker.sum,
        "requests": taker.oneway.len(),
        "request_p50_us": us(taker.oneway.value_at_quantile(0.50)),
        "request_p99_us": us(taker.oneway.value_at_quantile(0.99)),
        "request_p999_us": us(taker.oneway.value_at_quantile(0.999)),
    }))
}

/// Sends the answers to the requests in `asks` (frames back to back, lengths in `lens`):
/// each with its addresses swapped and marked a reply. What the ring does not take now
/// stays for the next call. Returns the answers sent.
fn answer(
    c: &mut NetClient,
    asks: &mut Vec<u8>,
    lens: &mut Vec<usize>,
    scratch: &mut [u8],
) -> Result<u64> {
    let mut off = 0;
    let n = c.send_burst(lens.len(), scratch, |k, buf| {
        let len = lens[k];
        let f = &asks[off..off + len];
        buf[..len].copy_from_slice(f);
        buf[0..6].copy_from_slice(&f[6..12]);
        buf[6..12].copy_from_slice(&f[0..6]);
        frame::set_kind(buf, frame::KIND_REPLY);
        off += len;
        len
    })?;
    asks.drain(..off);
    lens.drain(..n);
    Ok(n as u64)
}

/// Bytes an RR frame needs: the bench header, then flow id (u32), send time (u64 ns of
/// [`mono_ns`]) and whether it is recorded (u8).
const RR_MIN: usize = 64;
const RR_FLOW: usize = 30;
const RR_TS: usize = 34;
/// 1 when the client records the request's round trip (past its warm-up): the echo times
/// the same requests one way.
const RR_RECORD: usize = 42;
/// A request not answered within this is lost (ns).
const RR_TIMEOUT_NS: u64 = 20_000_000;

/// The flow and send time of a request/response frame: a request reflected as it was
/// (`pvnet backend --role echo`) or answered; None for anything else.
fn rr_answer(body: &[u8]) -> Option<(u32, u64)> {
    let kind = frame::kind(body);
    if body.len() < RR_MIN || !matches!(kind, Some(frame::KIND_REQUEST | frame::KIND_REPLY)) {
        return None;
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&body[RR_TS..RR_TS + 8]);
    let mut fl = [0u8; 4];
    fl.copy_from_slice(&body[RR_FLOW..RR_FLOW + 4]);
    Some((u32::from_le_bytes(fl), u64::from_le_bytes(w)))
}

/// A request unanswered for [`RR_TIMEOUT_NS`] by `t` ([`mono_ns`]) was lost (a
/// switch's queue dropped it, or its answer): its flow starts again. Returns how many.
fn expire(in_flight: &mut [Option<u64>], pending: &mut Vec<u32>, t: u64) -> u64 {
    let mut lost = 0;
    for (flow, sent) in in_flight.iter_mut().enumerate() {
        if sent.is_some_and(|s| t.saturating_sub(s) > RR_TIMEOUT_NS) {
            *sent = None;
            lost += 1;
            pending.push(u32::try_from(flow).unwrap_or(0));
        }
    }
    lost
}

/// Request/response: `--flows` requests in flight through `pvnet backend --role echo`.
fn rr(
    c: &mut NetClient,
    a: &FrontendArgs,
    frame_len: usize,
    mut p: Poller,
) -> Result<serde_json::Value> {
    let (mut scratch, tpl) = template(frame_len, RR_SRC, TX_DST);
    let mut hist = latency_histogram()?;
    let t0 = Instant::now();
    let dur = Duration::from_secs_f64(a.traffic.secs);
    // Warm-up: the first 10% of the run is not recorded.
    let record_from = t0 + dur / 10;
    let mut pending: Vec<u32> = (0..u32::from(a.flows)).collect();
    // Each flow's request in flight, by its send time: only its answer counts (a frame
    // that is not one, or a late copy, is a stray).
    let mut in_flight: Vec<Option<u64>> = vec![None; usize::from(a.flows)];
    let (mut strays, mut lost) = (0u64, 0u64);
    let mut body = vec![0u8; 2048];
    let (mut seq, mut done, mut next_report) = (0u64, 0u64, t0 + Duration::from_millis(250));
    let mut recorded = 0u64;
    c.disarm_rx();
    loop {
        let now = Instant::now();
        let running = now.duration_since(t0) < dur && !proc::stopping();
        if !pending.is_empty() && running {
            let mut k = 0usize;
            let n = c.send_burst(pending.len(), &mut scratch, |_, buf| {
                buf[..frame_len].copy_from_slice(&tpl);
                frame::set_seq(buf, seq + k as u64);
                frame::set_kind(buf, frame::KIND_REQUEST);
                buf[RR_FLOW..RR_FLOW + 4].copy_from_slice(&pending[k].to_le_bytes());
                let ts = mono_ns();
                buf[RR_TS..RR_TS + 8].copy_from_slice(&ts.to_le_bytes());
                buf[RR_RECORD] = u8::from(now >= record_from);
                if let Some(t) = in_flight.get_mut(pending[k] as usize) {
                    *t = Some(ts);
                }
                k += 1;
                frame_len
            })?;
            seq += n as u64;
            pending.drain(..n);
        }
        if !running && pending.len() == usize::from(a.flows) {
            break;
        }
        if now >= next_report {
            emit(&json!({ "progress": { "packets": done } }));
            next_report = now + Duration::from_millis(250);
        }
        let got = c.recv_burst(usize::MAX, |f| {
            let n = f.read(0, &mut body);
            let Some((flow, ts)) = rr_answer(&body[..n]) else {
                strays += 1;
                return;
            };
            match in_flight.get_mut(flow as usize) {
                Some(t) if *t == Some(ts) => *t = None,
                _ => {
                    strays += 1;
                    return;
                }
            }
            let lat = mono_ns().saturating_sub(ts);
            // Recorded as it was marked when sent (the echo times the same requests).
            if body[RR_RECORD] == 1 {
                let _ = hist.record(lat.max(1));
                recorded += 1;
            }
            pending.push(flow);
            done += 1;
        })?;
        if got > 0 {
            p.on_work(now);
        } else if pending.len() < usize::from(a.flows) {
            lost += expire(&mut in_flight, &mut pending, mono_ns());
            idle(c, &mut p, Ring::Rx, now)?;
        }
    }
    let measured = dur.as_secs_f64() * 0.9;
    let q = |x: f64| us(hist.value_at_quantile(x));
    Ok(json!({
        "flows": a.flows, "transactions": done, "recorded": recorded, "strays": strays, "lost": lost, "rr_per_sec": recorded as f64 / measured,
        "p50_us": q(0.50), "p99_us": q(0.99), "p999_us": q(0.999), "mean_us": hist.mean() / 1000.0,
    }))
}
