//! `pvnet backend`: a vhost-user net backend whose ports sink, generate or forward.

use crate::error::{io, usage, Result};
use crate::proc;
use clap::{Args, ValueEnum};
use pvnet_dataplane::Policy;
use pvnet_dataplane::{Dataplane, GenConfig, Role, WorkerConfig};
use pvnet_vhost::backend::{connect_loop, serve, BackendConfig, DeviceHooks};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What the backend's ports do.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum RoleArg {
    /// Consume every frame a frontend sends (reads every byte, checks sequence numbers).
    Sink,
    /// Sink, and fill each frontend's receive ring with numbered frames for --gen-secs.
    Gen,
    /// Pass frames between port pairs (0<->1, 2<->3, ... in connection order), one copy each.
    Forward,
    /// Send every frame back to the frontend that sent it (request/response tests).
    Echo,
}

/// `pvnet backend` arguments.
#[derive(Args, Debug, Clone)]
pub struct BackendArgs {
    /// vhost-user socket path.
    #[arg(long)]
    pub socket: PathBuf,
    /// Connect to the socket as a client (the frontend listens, e.g. QEMU server=on) and
    /// reconnect when it goes away, instead of listening.
    #[arg(long)]
    pub client: bool,
    /// What ports do with packets.
    #[arg(long, value_enum, default_value_t = RoleArg::Sink)]
    pub role: RoleArg,
    /// Generator frame length in bytes (virtio-net header not included).
    #[arg(long, default_value_t = 64)]
    pub frame_len: usize,
    /// Generator: seconds to send after a frontend's receive queue starts.
    #[arg(long, default_value_t = 2.0)]
    pub gen_secs: f64,
    /// Exit after this many frontend sessions have connected and gone (0: run until signalled).
    #[arg(long, default_value_t = 0)]
    pub sessions: u32,
    /// Pin the dataplane worker to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// When to poll an empty transmit ring and when to arm its notifications and sleep:
    /// adaptive (learned, time-bounded polling window), notify (arm at once), timer:<us>
    /// (never armed, drained every period), spin:<n> (arm after n empty polls), busy (never
    /// sleep), coalesce:<us> (adaptive, but a steady stream is drained once per period with
    /// notifications off instead of polled: the period lasts while half the ring fills at the
    /// measured rate, at most <us>; CPU follows the load, for up to <us> more latency).
    #[arg(long, default_value = "adaptive")]
    pub policy: Policy,
    /// The same, for receive rings while the backend waits for the frontend's buffers.
    #[arg(long, default_value = "adaptive")]
    pub rx_policy: Policy,
    /// Most chains per ring per round.
    #[arg(long, default_value_t = 64)]
    pub batch: u16,
    /// Microseconds a transmit-completion call may be held back so that the completions of
    /// that time take one interrupt (like a NIC's tx-usecs; at least two wake-ups).
    #[arg(long, default_value_t = 150)]
    pub tx_call_delay: u64,
    /// Queue pairs offered to each frontend.
    #[arg(long, default_value_t = 1)]
    pub queue_pairs: u16,
    /// Worker threads (shards). Frontends are spread over them by port id (a forwarding pair
    /// stays together); each shard polls only its own ports.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
}

/// Runs the backend; prints the final per-port counters as one JSON line on stdout.
pub fn run(a: &BackendArgs) -> Result<()> {
    proc::install_stop_handler();
    if a.shards == 0 || a.shards > 64 {
        return Err(usage("--shards must be within 1..=64"));
    }
    if a.batch == 0 {
        return Err(usage("--batch must be at least 1"));
    }
    if !(a.gen_secs.is_finite() && a.gen_secs >= 0.0) {
        return Err(usage("--gen-secs must be a non-negative number"));
    }
    let role = match a.role {
        RoleArg::Sink => Role::Sink,
        RoleArg::Forward => Role::Forward,
        RoleArg::Echo => Role::Echo,
        RoleArg::Gen => Role::Gen(GenConfig {
            frame_len: a
                .frame_len
                .clamp(pvnet_dataplane::frame::MIN_FRAME, 65536 - 12),
            duration: Duration::from_secs_f64(a.gen_secs),
        }),
    };
    let cfg = WorkerConfig {
        role,
        policy: a.policy,
        rx_policy: a.rx_policy,
        batch: a.batch,
        cpu: a.cpu,
        tx_call_delay: Duration::from_micros(a.tx_call_delay),
        shards: a.shards,
        // Bench roles hold packets in their senders (no egress queue).
        egress: pvnet_dataplane::EgressConfig::hold(pvnet_dataplane::HoldPolicy::Forever),
        // Bench roles place ports by id (forwarding pairs together) and never move them.
        rebalance: pvnet_dataplane::RebalanceConfig {
            enabled: false,
            ..Default::default()
        },
    };
    let dp = Dataplane::start(cfg).map_err(io("starting the dataplane"))?;
    dp.keep_control_off_workers();
    let hooks: Arc<dyn DeviceHooks> = dp.clone();
    let stop = pvnet_vhost::Stop::new().map_err(io("eventfd"))?;
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.is_set() {
                if proc::stopping() {
                    stop.set();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let bcfg = BackendConfig {
        queue_pairs: a.queue_pairs.max(1),
        ..BackendConfig::default()
    };
    let sessions = (a.sessions > 0).then_some(a.sessions);
    let r = if a.client {
        connect_loop(
            &a.socket,
            Arc::new(std::sync::Mutex::new(bcfg)),
            hooks,
            stop.clone(),
            Duration::from_millis(200),
            None,
        );
        Ok(())
    } else {
        serve(&a.socket, bcfg, hooks, stop.clone(), sessions)
    };
    stop.set();
    let _ = watcher.join();
    let ports = dp.snapshots();
    dp.shutdown();
    r.map_err(io(a.socket.display()))?;
    println!("{}", serde_json::json!({ "final": { "ports": ports } }));
    Ok(())
}
