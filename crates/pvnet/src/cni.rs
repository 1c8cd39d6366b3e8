//! `pvnet cni`: a CNI plugin (container network interface, spec 1.0) that attaches a pod's
//! interface to a running `pvnet switch` through a vhost-user socket, over the switch's
//! control socket (the same requests as `pvnet ctl port add|del`). Installed as
//! `packaging/cni/pvnet-cni` in the runtime's plugin directory; docs/operations.md.
//!
//! It follows the userspace CNI plugin's conventions: the sockets of one container live in a
//! directory of their own, `<sharedDir>/<first 12 of the container id>/`, which the pod mounts;
//! each interface's socket is `<id12>-<ifname>` there; `host.vhost.mode` says which side
//! listens (`client`, the default: the container's application listens, as DPDK
//! `net_virtio_user,server=1` does, and pvnet connects, so either side can restart without
//! the other). The switch port is named `<id12>-<ifname>`. ADD and DEL are idempotent: an ADD
//! of an interface already attached succeeds, a DEL of one that is gone succeeds. The ports
//! outlive a restart of the switch when it runs with `--state`.
//!
//! Input: `CNI_COMMAND` (ADD, DEL, CHECK, VERSION), `CNI_CONTAINERID`, `CNI_IFNAME`,
//! `CNI_NETNS` (not used: a vhost-user interface is a socket, not a netdev) and the network
//! configuration on stdin. Output: the result (ADD) or an error object on stdout, exit status 0
//! or 1.

use crate::ctl::{self, Op};
use crate::error::Result;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

/// CNI versions this plugin answers in.
const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Where socket directories go unless the configuration says (the userspace CNI's default).
const DEFAULT_SHARED_DIR: &str = "/var/lib/cni/usrspcni";

/// The network configuration (stdin).
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct NetConf {
    cni_version: String,
    /// The switch's control socket.
    #[serde(default = "default_ctl")]
    ctl_socket: PathBuf,
    /// Base directory of the per-container socket directories.
    #[serde(default = "default_shared")]
    shared_dir: PathBuf,
    #[serde(default)]
    host: HostConf,
    /// More port settings, `key: value` as in a `--port` spec (qdisc, offloads, ...).
    #[serde(default)]
    port: BTreeMap<String, Value>,
}

#[derive(Deserialize, Debug, Default)]
struct HostConf {
    #[serde(default)]
    vhost: VhostConf,
}

#[derive(Deserialize, Debug)]
struct VhostConf {
    /// pvnet's side: `client` (it connects to the container's socket) or `server`.
    #[serde(default = "default_mode")]
    mode: String,
}

impl Default for VhostConf {
    fn default() -> Self {
        Self {
            mode: default_mode(),
        }
    }
}

fn default_ctl() -> PathBuf {
    ctl::DEFAULT_CTL_SOCKET.into()
}
fn default_shared() -> PathBuf {
    DEFAULT_SHARED_DIR.into()
}
fn default_mode() -> String {
    "client".into()
}

/// A CNI error: its code (the spec's well-known codes) and message.
struct CniError {
    code: u32,
    msg: String,
    details: String,
}

fn err(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError {
        code,
        msg: msg.into(),
        details: details.into(),
    }
}

fn env(name: &str) -> std::result::Result<String, CniError> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| err(4, format!("{name} is not set"), "a CNI runtime sets it"))
}

/// The port of one container interface: its switch name and socket path.
fn port_of(
    conf: &NetConf,
    id: &str,
    ifname: &str,
) -> std::result::Result<(String, PathBuf), CniError> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !ok(id) || !ok(ifname) || ifname.starts_with('.') {
        return Err(err(
            4,
            "bad container id or interface name",
            format!("CNI_CONTAINERID={id:?} CNI_IFNAME={ifname:?}"),
        ));
    }
    let short: String = id.chars().take(12).collect();
    let name = format!("{short}-{ifname}");
    Ok((name.clone(), conf.shared_dir.join(&short).join(name)))
}

/// The `--port` spec of a container interface.
fn spec_of(
    conf: &NetConf,
    name: &str,
    sock: &std::path::Path,
) -> std::result::Result<String, CniError> {
    let client = match conf.host.vhost.mode.as_str() {
        "client" => true,
        "server" => false,
        m => {
            return Err(err(
                7,
                format!("host.vhost.mode {m:?}"),
                "client (pvnet connects to the container's socket) or server",
            ))
        }
    };
    let mut spec = format!(
        "vhost-user:name={name},socket={},client={client}",
        sock.display()
    );
    for (k, v) in &conf.port {
        if matches!(k.as_str(), "name" | "socket" | "client" | "kind") {
            return Err(err(7, format!("port.{k} is set by the plugin"), ""));
        }
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Bool(_) | Value::Number(_) => v.to_string(),
            _ => return Err(err(7, format!("port.{k}: a string, number or boolean"), "")),
        };
        if v.contains([',', '\n']) {
            return Err(err(7, format!("port.{k}: no commas"), ""));
        }
        spec.push_str(&format!(",{k}={v}"));
    }
    Ok(spec)
}

fn run_inner(stdin: &str) -> std::result::Result<Option<Value>, CniError> {
    let cmd = env("CNI_COMMAND")?;
    if cmd == "VERSION" {
        return Ok(Some(
            json!({ "cniVersion": "1.0.0", "supportedVersions": VERSIONS }),
        ));
    }
    let conf: NetConf = serde_json::from_str(stdin)
        .map_err(|e| err(6, "cannot decode the network configuration", e.to_string()))?;
    if !VERSIONS.contains(&conf.cni_version.as_str()) {
        return Err(err(
            1,
            format!("CNI version {} not supported", conf.cni_version),
            VERSIONS.join(", "),
        ));
    }
    let id = env("CNI_CONTAINERID")?;
    let ifname = env("CNI_IFNAME")?;
    let (name, sock) = port_of(&conf, &id, &ifname)?;
    let switch = |e: crate::error::Error| err(11, "pvnet switch", e.to_string());
    match cmd.as_str() {
        "ADD" => {
            let spec = spec_of(&conf, &name, &sock)?;
            if let Some(dir) = sock.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| err(11, format!("creating {}", dir.display()), e.to_string()))?;
            }
            ctl::change(&conf.ctl_socket, Op::PortAdd { spec }).map_err(switch)?;
            Ok(Some(json!({
                "cniVersion": conf.cni_version,
                "interfaces": [{ "name": ifname, "socketPath": sock }],
                "ips": [],
                "dns": {},
            })))
        }
        "DEL" => {
            match ctl::change(&conf.ctl_socket, Op::PortDel { name }) {
                Ok(_) => {}
                // The switch gone is not the pod's problem at delete: nothing of it is left
                // to remove but the socket directory.
                Err(crate::error::Error::Io { .. }) => {}
                Err(e) => return Err(switch(e)),
            }
            // The socket goes with the pod, whichever side made it (the pod is being torn
            // down); a file that is not a socket is left alone.
            if std::fs::symlink_metadata(&sock)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            {
                let _ = std::fs::remove_file(&sock);
            }
            if let Some(dir) = sock.parent() {
                let _ = std::fs::remove_dir(dir); // only when empty: other interfaces stay
            }
            Ok(None)
        }
        "CHECK" => {
            let s = ctl::request(&conf.ctl_socket, "ports").map_err(switch)?;
            if s.ports.iter().any(|p| p.name == name) {
                Ok(None)
            } else {
                Err(err(11, format!("port {name} is not on the switch"), ""))
            }
        }
        other => Err(err(
            4,
            format!("CNI_COMMAND {other:?}"),
            "ADD, DEL, CHECK or VERSION",
        )),
    }
}

/// Runs the plugin: reads stdin, acts, prints the result or the error object.
pub fn run() -> Result<()> {
    let mut stdin = String::new();
    let read = std::io::stdin().read_to_string(&mut stdin);
    let out = match read
        .map_err(|e| err(6, "cannot read stdin", e.to_string()))
        .and_then(|_| run_inner(&stdin))
    {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(()),
        Err(e) => {
            let v = json!({ "cniVersion": "1.0.0", "code": e.code, "msg": e.msg, "details": e.details });
            println!("{v}");
            return Err(crate::error::failed(format!(
                "cni: {}: {}",
                e.msg, e.details
            )));
        }
    };
    println!("{out}");
    Ok(())
}
