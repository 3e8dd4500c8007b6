//! Hosts on a LAN, all on this machine: network namespaces whose veth pairs meet on a
//! bridge in this one, which holds the LAN's first address. Nothing leaves the machine.

use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// LANs this process has made, for unique names.
static LANS_MADE: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A bridge and `hosts` namespaces on it; deleted on drop.
pub struct Lan {
    bridge: String,
    /// This side's address on the LAN (the driver listens here).
    pub gateway: String,
    pub hosts: Vec<Host>,
}

pub struct Host {
    /// The namespace, for `ip netns exec`.
    pub netns: String,
    /// Its address on the LAN.
    pub address: String,
}

impl Lan {
    pub fn create(hosts: usize) -> Lan {
        // Named after the process and, as the tests of one binary share a process under
        // `cargo test`, after how many LANs it made before: two at once must not share
        // a bridge, an interface name or a subnet.
        let made = LANS_MADE.fetch_add(1, Ordering::Relaxed);
        let n = format!("{}x{made}", std::process::id() % 100_000);
        let subnet = format!("10.214.{}", (std::process::id() + made) % 250);
        let bridge = format!("flb{n}");
        let gateway = format!("{subnet}.1");
        let mut lan = Lan {
            bridge: bridge.clone(),
            gateway: gateway.clone(),
            hosts: Vec::new(),
        };
        ip(&["link", "add", "name", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for i in 0..hosts {
            let netns = format!("flint-lan-{n}-{i}");
            let (outside, inside) = (format!("fl{n}h{i}"), format!("fl{n}e{i}"));
            let address = format!("{subnet}.{}", i + 2);
            ip(&["netns", "add", &netns]);
            lan.hosts.push(Host {
                netns: netns.clone(),
                address: address.clone(),
            });
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ]);
            ip(&["link", "set", &inside, "netns", &netns]);
            ip(&["link", "set", &outside, "master", &bridge]);
            ip(&["link", "set", &outside, "up"]);
            let within = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &netns, "ip"];
                all.extend_from_slice(args);
                ip(&all);
            };
            within(&["addr", "add", &format!("{address}/24"), "dev", &inside]);
            within(&["link", "set", &inside, "up"]);
            within(&["link", "set", "lo", "up"]);
        }
        lan
    }

    /// The driver's listen addresses and flags for executors that connect over the LAN.
    pub fn driver_args(&self) -> Vec<String> {
        vec![
            "--listen".into(),
            format!("{}:0", self.gateway),
            "--executor-listen".into(),
            format!("{}:0", self.gateway),
            // Beyond loopback the driver wants secrets; the LAN's addresses exist only
            // inside this machine's network namespaces.
            "--insecure".into(),
        ]
    }
}

impl Host {
    /// `program args...` run inside this host's namespace (`ip netns exec` execs it, so
    /// the child's pid is the program's).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns, program]);
        command
    }

    /// Drops every packet in and out of the host: no reset, no close, silence.
    pub fn partition(&self) {
        for chain in ["INPUT", "OUTPUT"] {
            self.iptables(&["-A", chain, "-j", "DROP"]);
        }
    }

    pub fn heal(&self) {
        self.iptables(&["-F"]);
    }

    /// Adds `cidr` to the host's interface `dev` (`lo` for an address only the host
    /// itself reaches, as a metadata service's is from inside a VM).
    pub fn add_address(&self, cidr: &str, dev: &str) {
        ip(&[
            "netns",
            "exec",
            &self.netns,
            "ip",
            "addr",
            "add",
            cidr,
            "dev",
            dev,
        ]);
    }

    /// Makes `text` the `/etc/hosts` of what runs through [`Host::command`] (and
    /// `process::executor_in_netns`): `ip netns exec` bind-mounts the files of
    /// `/etc/netns/<netns>/` over `/etc`'s. Removed with the LAN.
    pub fn hosts_file(&self, text: &str) {
        let dir = format!("/etc/netns/{}", self.netns);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(format!("{dir}/hosts"), text).unwrap();
    }

    /// Runs `f` on a thread of its own inside the host's namespace, and returns what it
    /// returned. Sockets it makes stay in the namespace whichever thread uses them
    /// later, so a test's server can listen on the host's own addresses.
    pub fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let namespace = std::fs::File::open(format!("/run/netns/{}", self.netns)).unwrap();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: a plain syscall on a valid descriptor; a network namespace
                    // is per thread, so only this thread, which ends with `f`, moves.
                    let rc = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                    f()
                })
                .join()
                .unwrap()
        })
    }

    fn iptables(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.netns, "iptables"];
        all.extend_from_slice(args);
        ip(&all);
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and the pair with it.
        for host in &self.hosts {
            let _ = Command::new("ip")
                .args(["netns", "del", &host.netns])
                .status();
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", host.netns));
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(Stdio::null())
            .status();
    }
}
