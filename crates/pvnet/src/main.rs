//! `pvnet`: a vhost-user virtio-net backend, its own userspace frontend, and the benchmark
//! that runs them against each other and against this machine's limits.

// The argument structs' doc comments are `--help` text (clap prints them as written), not
// rustdoc: `<us>` and `[switch]` there are a placeholder and a TOML table.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

mod args;
mod backend_cmd;
mod bench;
mod cni;
mod ctl;
mod error;
mod frontend_cmd;
mod limits;
mod proc;
mod switch;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
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
    Switch(switch::SwitchArgs),
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

/// The whole `pvnet` command, old flag names included (hidden; see [`args::RENAMED`]).
fn command() -> clap::Command {
    args::with_old_names(Cli::command())
}

/// Parses `argv` (the program name first); returns the command and the old flag names it
/// used.
fn parse_from(argv: Vec<OsString>) -> Result<(Cli, Vec<&'static args::Renamed>), clap::Error> {
    let m = command().try_get_matches_from(&argv)?;
    let lossy: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let old = args::old_names_used(&lossy, &args::subcommand_path(&m));
    Ok((Cli::from_arg_matches(&m)?, old))
}

fn main() -> ExitCode {
    proc::bound_heap();
    init_logging();
    let cli = match parse_from(std::env::args_os().collect()) {
        Ok((cli, old)) => {
            for r in old {
                tracing::warn!("--{} is deprecated: use --{}", r.old, r.new);
            }
            cli
        }
        Err(e) => e.exit(),
    };
    let r = match cli.cmd.unwrap_or(Cmd::Bench(bench::BenchArgs::default())) {
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Backend(a) => backend_cmd::run(&a),
        Cmd::Frontend(a) => frontend_cmd::run(&a),
        Cmd::Switch(a) => switch::run(&a),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Sizes, RENAMED};
    use crate::backend_cmd::{BackendArgs, RoleArg};
    use crate::frontend_cmd::{FrontRole, FrontendArgs, RxMode, TxModeArg};
    use pvnet_dataplane::Policy;
    use pvnet_vhost::frontend::{GrantMode, RxBuffers};
    use std::time::Duration;

    fn parse(line: &[&str]) -> (Cli, Vec<&'static args::Renamed>) {
        let argv = std::iter::once("pvnet")
            .chain(line.iter().copied())
            .map(OsString::from)
            .collect();
        parse_from(argv).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    fn parse_strings(line: &[String]) -> Cli {
        let line: Vec<&str> = line.iter().map(String::as_str).collect();
        let (cli, old) = parse(&line);
        assert!(old.is_empty(), "{line:?} uses old names: {old:?}");
        cli
    }

    #[test]
    fn the_command_is_well_formed() {
        command().debug_assert();
    }

    #[test]
    fn a_backend_renders_to_a_command_line_that_parses_back() {
        let mut b = BackendArgs::new("/tmp/x y.sock".into(), RoleArg::Gen);
        let check = |b: &BackendArgs| match parse_strings(&b.command_line()).cmd {
            Some(Cmd::Backend(p)) => assert_eq!(&p, b),
            other => panic!("{other:?}"),
        };
        check(&b);
        b.client = true;
        b.sessions = 3;
        b.queue_pairs = 2;
        b.traffic.frame_len = Sizes::one(1500);
        b.traffic.secs = 0.25;
        b.dp.poll.cpu = Some(1);
        b.dp.poll.policy = Some(Policy::Timer(Duration::from_micros(150)));
        b.dp.poll.batch = Some(32);
        b.dp.workers = Some(2);
        b.dp.rx_policy = Some(Policy::Coalesce(Duration::from_micros(500)));
        b.dp.tx_call_delay = Some(0);
        check(&b);
    }

    #[test]
    fn a_frontend_renders_to_a_command_line_that_parses_back() {
        let mut f = FrontendArgs::new("/tmp/f.sock".into(), FrontRole::Rr);
        let check = |f: &FrontendArgs| match parse_strings(&f.command_line()).cmd {
            Some(Cmd::Frontend(p)) => assert_eq!(&p, f),
            other => panic!("{other:?}"),
        };
        check(&f);
        f.role = FrontRole::Drop;
        f.traffic.frame_len = Sizes { min: 60, max: 1514 };
        f.traffic.secs = 1.5;
        f.count = 7;
        f.rate = 1000;
        f.paced_batches = true;
        f.flows = 10;
        f.ring.queue_size = 1024;
        f.ring.packed = true;
        f.ring.grants = GrantMode::PerPacket;
        f.poll.cpu = Some(0);
        f.poll.policy = Some(Policy::Spin(256));
        f.poll.batch = Some(8);
        f.tx_mode = TxModeArg::Rx;
        f.idle_timeout = 3.0;
        f.no_event_idx = true;
        f.legacy_hdr = true;
        f.rx_buffers = RxBuffers::Fixed(4096);
        f.rx_headroom = 256;
        f.rx_mode = RxMode::Copy;
        f.guest_tso = true;
        f.announce = true;
        check(&f);
    }

    #[test]
    fn old_flag_names_still_work_and_are_reported() {
        let (cli, old) = parse(&[
            "backend",
            "--socket",
            "/s",
            "--shards",
            "2",
            "--gen-secs=1.5",
        ]);
        let Some(Cmd::Backend(b)) = cli.cmd else {
            panic!("not backend")
        };
        assert_eq!((b.dp.workers, b.traffic.secs), (Some(2), 1.5));
        let pairs: Vec<_> = old.iter().map(|r| (r.old, r.new)).collect();
        assert_eq!(pairs, [("shards", "workers"), ("gen-secs", "secs")]);
        let (cli, old) = parse(&[
            "frontend",
            "--socket",
            "/s",
            "--poll",
            "busy",
            "--burst",
            "16",
            "--paced-bursts",
        ]);
        let Some(Cmd::Frontend(f)) = cli.cmd else {
            panic!("not frontend")
        };
        assert_eq!(f.poll.policy, Some(Policy::Busy));
        assert_eq!(f.poll.batch, Some(16));
        assert!(f.paced_batches);
        assert_eq!(old.len(), 3);
        let (cli, old) = parse(&["bench", "--size", "1500", "sweep", "--size", "128"]);
        let Some(Cmd::Bench(b)) = cli.cmd else {
            panic!("not bench")
        };
        assert_eq!(b.traffic.frame_len, Sizes::one(1500));
        let Some(bench::BenchSub::Sweep(s)) = b.sub else {
            panic!("not sweep")
        };
        assert_eq!(s.frame_len, 128);
        assert_eq!(old.len(), 1, "{old:?}");
        let (cli, old) = parse(&["switch", "--duration", "3"]);
        let Some(Cmd::Switch(s)) = cli.cmd else {
            panic!("not switch")
        };
        assert_eq!((s.secs, old[0].new), (3.0, "secs"));
        // A global flag: before and after the subcommand.
        for line in [
            &["ctl", "--socket", "/c", "port", "del", "x"][..],
            &["ctl", "port", "del", "x", "--socket", "/c"],
        ] {
            let (cli, old) = parse(line);
            let Some(Cmd::Ctl(c)) = cli.cmd else {
                panic!("not ctl")
            };
            assert_eq!(c.ctl_socket, std::path::PathBuf::from("/c"));
            assert_eq!(old[0].new, "ctl-socket");
        }
        // The new names draw no warning; an old name and its new one together are refused.
        assert!(parse(&["backend", "--socket", "/s", "--workers", "2"])
            .1
            .is_empty());
        let argv = [
            "pvnet",
            "backend",
            "--socket",
            "/s",
            "--workers",
            "2",
            "--shards",
            "2",
        ];
        assert!(parse_from(argv.iter().map(OsString::from).collect()).is_err());
    }

    /// Every command's help, by its subcommand path.
    fn helps(cmd: &mut clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
        out.push((path.clone(), cmd.render_long_help().to_string()));
        for sub in cmd.get_subcommands_mut() {
            let mut p = path.clone();
            p.push(sub.get_name().to_owned());
            helps(sub, p, out);
        }
    }

    #[test]
    fn help_shows_only_the_new_names() {
        let mut cmd = command();
        cmd.build();
        let mut all = Vec::new();
        helps(&mut cmd, Vec::new(), &mut all);
        assert!(all.len() > 8, "{}", all.len());
        for r in RENAMED {
            let here: Vec<&(Vec<String>, String)> = all
                .iter()
                .filter(|(p, _)| {
                    p.len() >= r.path.len() && r.path.iter().zip(p).all(|(a, b)| a == b)
                })
                .collect();
            assert!(!here.is_empty(), "{:?}", r.path);
            for (p, help) in here {
                let old = format!("--{}", r.old);
                let shown = help.match_indices(&old).any(|(i, _)| {
                    let before = help[..i].chars().next_back();
                    let after = help[i + old.len()..].chars().next();
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
                        && !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
                });
                assert!(!shown, "{p:?} help shows {old}:\n{help}");
            }
            let (_, help) = all
                .iter()
                .find(|(p, _)| p.as_slice() == r.path)
                .expect("command");
            assert!(
                help.contains(&format!("--{}", r.new)),
                "{:?} --{}",
                r.path,
                r.new
            );
        }
    }
}
