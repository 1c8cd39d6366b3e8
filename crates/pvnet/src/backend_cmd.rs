//! `pvnet backend`: a vhost-user net backend whose ports sink, generate or forward.

use crate::args::{self, DataplaneArgs, ToArgs, TrafficArgs};
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
    /// Sink, and fill each frontend's receive ring with numbered frames for --secs.
    Gen,
    /// Pass frames between port pairs (0<->1, 2<->3, ... in connection order), one copy each.
    Forward,
    /// Send every frame back to the frontend that sent it (request/response tests).
    Echo,
}

args::value_enum_arg!(RoleArg);

/// `pvnet backend` arguments.
#[derive(Args, Debug, Clone, PartialEq)]
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
    /// The generator's frames (--role gen; one length, not MIN-MAX) and how long it sends.
    #[command(flatten)]
    pub traffic: TrafficArgs,
    /// Exit after this many frontend sessions have connected and gone (0: run until signalled).
    #[arg(long, default_value_t = 0)]
    pub sessions: u32,
    /// Queue pairs offered to each frontend.
    #[arg(long, default_value_t = 1)]
    pub queue_pairs: u16,
    #[command(flatten)]
    pub dp: DataplaneArgs,
}

impl BackendArgs {
    /// A backend on `socket` doing `role`, everything else as its defaults.
    pub fn new(socket: PathBuf, role: RoleArg) -> Self {
        Self {
            socket,
            client: false,
            role,
            traffic: TrafficArgs::default(),
            sessions: 0,
            queue_pairs: 1,
            dp: DataplaneArgs::default(),
        }
    }

    /// The command line that runs this backend: `backend --socket ... --role ...`.
    pub fn command_line(&self) -> Vec<String> {
        let Self {
            socket,
            client,
            role,
            traffic,
            sessions,
            queue_pairs,
            dp,
        } = self;
        let mut out = vec!["backend".to_owned()];
        args::push_args!(&mut out; socket, client, role);
        traffic.push_args(&mut out);
        args::push_args!(&mut out; sessions, queue_pairs);
        dp.push_args(&mut out);
        out
    }
}

/// The dataplane's configuration from the arguments.
fn worker_config(a: &BackendArgs) -> Result<WorkerConfig> {
    let workers = a.dp.workers.unwrap_or(1);
    if workers == 0 || workers > 64 {
        return Err(usage("--workers must be within 1..=64"));
    }
    let batch = a.dp.poll.batch();
    if batch == 0 {
        return Err(usage("--batch must be at least 1"));
    }
    let secs = a.traffic.secs;
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(usage("--secs must be a non-negative number"));
    }
    let Some(frame_len) = a.traffic.frame_len.single() else {
        return Err(usage(
            "--frame-len MIN-MAX (mixed sizes) is for pvnet frontend only",
        ));
    };
    let role = match a.role {
        RoleArg::Sink => Role::Sink,
        RoleArg::Forward => Role::Forward,
        RoleArg::Echo => Role::Echo,
        RoleArg::Gen => Role::Gen(GenConfig {
            frame_len: frame_len.clamp(pvnet_dataplane::frame::MIN_FRAME, 65536 - 12),
            duration: Duration::from_secs_f64(secs),
        }),
    };
    Ok(WorkerConfig {
        role,
        policy: a.dp.poll.policy(),
        rx_policy: a.dp.rx_policy.unwrap_or(Policy::Adaptive),
        batch,
        cpu: a.dp.poll.cpu,
        tx_call_delay: Duration::from_micros(
            a.dp.tx_call_delay
                .unwrap_or(DataplaneArgs::TX_CALL_DELAY_US),
        ),
        shards: workers,
        // Bench roles hold packets in their senders (no egress queue).
        egress: pvnet_dataplane::EgressConfig::hold(pvnet_dataplane::HoldPolicy::Forever),
        // Bench roles place ports by id (forwarding pairs together) and never move them.
        rebalance: pvnet_dataplane::RebalanceConfig {
            enabled: false,
            ..Default::default()
        },
    })
}

/// Runs the backend; prints the final per-port counters as one JSON line on stdout.
pub fn run(a: &BackendArgs) -> Result<()> {
    proc::install_stop_handler();
    let cfg = worker_config(a)?;
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
