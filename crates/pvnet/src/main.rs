//! `pvnet`: a vhost-user virtio-net backend, its own userspace frontend, and the benchmark
//! that runs them against each other and against this machine's limits.

// The argument structs' doc comments are `--help` text (clap prints them as written), not
// rustdoc: `<us>` and `[switch]` there are a placeholder and a TOML table.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

mod backend_cmd;
mod bench;
mod cni;
mod ctl;
mod error;
mod frontend_cmd;
mod limits;
mod proc;
mod sweep;
mod switch_cmd;
mod switch_rt;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "pvnet",
    version,
    about = "Userspace paravirtual network dataplane: vhost-user backend, virtio-net frontend, benchmark",
    long_about = "pvnet moves packets between virtio-net frontends over vhost-user shared-memory \
virtqueues.\n\nWith no subcommand it runs `pvnet bench` on its built-in default: a pvnet backend \
and pvnet frontend processes exchange 64-byte packets one way each direction and both ways \
through the backend, and the result is printed next to this machine's limits."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Benchmark: backend and frontend processes over a vhost-user socket (the default job).
    Bench(bench::BenchArgs),
    /// Run a vhost-user net backend (sink, generator or forwarder) on a socket.
    Backend(backend_cmd::BackendArgs),
    /// Run pvnet's virtio-net frontend against a vhost-user net backend.
    Frontend(frontend_cmd::FrontendArgs),
    /// Measure this machine's limits: core-to-core hand-off and a 64-byte-slot ring.
    Limits,
    /// Run the switch daemon: vhost-user, tap, sink and gen ports, L2 learning between them.
    Switch(switch_cmd::SwitchArgs),
    /// Query or change a running `pvnet switch`: ports, counters, learned MAC addresses; add,
    /// delete and change ports; reload its configuration.
    Ctl(ctl::CtlArgs),
    /// A CNI plugin attaching a pod's interface to a running switch (run by a container
    /// runtime: CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, the configuration on stdin; see
    /// docs/operations.md and packaging/cni/).
    Cni,
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PVNET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let r = match cli.cmd.unwrap_or(Cmd::Bench(bench::BenchArgs::default())) {
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Backend(a) => backend_cmd::run(&a),
        Cmd::Frontend(a) => frontend_cmd::run(&a),
        Cmd::Switch(a) => switch_cmd::run(&a),
        Cmd::Ctl(a) => ctl::run(&a),
        Cmd::Cni => cni::run(),
        Cmd::Limits => {
            let l = limits::measure_default();
            println!("{}", serde_json::to_string(&l).unwrap_or_default());
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvnet: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
