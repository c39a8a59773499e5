//! The compose file and the no-Docker cluster script describe the same five
//! nodes: the agreement test.

use std::collections::BTreeSet;
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

/// A service's field, following a YAML merge key (`<<: *node`) as Compose
/// does.
fn field<'a>(service: &'a Yaml, name: &str) -> &'a Yaml {
    let own = &service[name];
    if own.is_badvalue() {
        &service["<<"][name]
    } else {
        own
    }
}

fn compose() -> Yaml {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docker-compose.redlock.yml"
    ))
    .expect("read the compose file");
    let mut docs = YamlLoader::load_from_str(&text).expect("the compose file is YAML");
    assert_eq!(docs.len(), 1);
    docs.remove(0)
}

/// host port -> container port, from the compose file.
fn compose_ports(doc: &Yaml) -> Vec<(u16, u16, String)> {
    let services = doc["services"].as_hash().expect("services");
    let mut out = Vec::new();
    for (name, service) in services {
        let name = name.as_str().unwrap().to_owned();
        let ports = service["ports"].as_vec().expect("ports");
        assert_eq!(ports.len(), 1, "{name}: one published port");
        let mapping = ports[0].as_str().expect("port mapping");
        let parts: Vec<&str> = mapping.split(':').collect();
        assert_eq!(parts.len(), 3, "{name}: ip:host:container");
        assert_eq!(parts[0], "127.0.0.1", "{name}: published on loopback only");
        let (host, container) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
        // the node listens on the port it is published on
        let command: Vec<&str> = service["command"]
            .as_vec()
            .expect("command")
            .iter()
            .map(|y| y.as_str().unwrap())
            .collect();
        let port_at = command.iter().position(|a| *a == "--port").expect("--port");
        assert_eq!(command[port_at + 1], parts[2], "{name}");
        assert!(
            command.contains(&"/usr/local/etc/redis/redis.conf"),
            "{name} uses the shared config"
        );
        out.push((host, container, name));
    }
    out
}

fn script_ports() -> Vec<u16> {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh"))
        .arg("ports")
        .output()
        .expect("run scripts/cluster.sh ports");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().expect("a port"))
        .collect()
}

#[test]
fn compose_has_five_independent_masters_on_loopback() {
    let doc = compose();
    let ports = compose_ports(&doc);
    assert_eq!(ports.len(), 5, "five services");
    let hosts: BTreeSet<u16> = ports.iter().map(|p| p.0).collect();
    assert_eq!(hosts.len(), 5, "five distinct ports");
    for (host, container, name) in &ports {
        assert_eq!(host, container, "{name}");
        let service = &doc["services"][name.as_str()];
        assert!(
            field(service, "healthcheck")["test"].as_vec().is_some(),
            "{name}: health check"
        );
        let text = format!("{service:?}");
        assert!(
            !text.contains("replicaof") && !text.contains("slaveof"),
            "{name}: no replication"
        );
        let volumes = field(service, "volumes").as_vec().expect("volumes");
        assert!(
            volumes.iter().any(|v| v
                .as_str()
                .unwrap()
                .starts_with("./cluster/redis-node.conf:")),
            "{name} mounts the shared config"
        );
    }
    assert!(doc["services"].as_hash().unwrap().keys().all(|k| {
        let image = field(&doc["services"][k.as_str().unwrap()], "image");
        image.as_str().is_some_and(|i| i.starts_with("redis:7"))
    }));
}

#[test]
fn compose_and_script_agree_on_the_ports() {
    let compose: BTreeSet<u16> = compose_ports(&compose()).iter().map(|p| p.0).collect();
    let script: BTreeSet<u16> = script_ports().into_iter().collect();
    assert_eq!(compose, script);
    assert_eq!(script, (7001..=7005).collect());
}

#[test]
fn the_shared_config_persists_every_write() {
    let conf = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/cluster/redis-node.conf"
    ))
    .unwrap();
    let settings: Vec<&str> = conf
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for needed in [
        "appendonly yes",
        "appendfsync always",
        "maxmemory-policy noeviction",
    ] {
        assert!(settings.contains(&needed), "missing {needed:?}");
    }
    assert!(!settings.iter().any(|l| l.starts_with("replicaof")));
}

/// Stops the script's cluster (and removes its data) however the test ends.
struct ScriptCluster {
    dir: std::path::PathBuf,
}

impl ScriptCluster {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh"))
            .args(args)
            .env("REDLOCK_CLUSTER_DIR", &self.dir)
            .output()
            .expect("run scripts/cluster.sh")
    }
}

impl Drop for ScriptCluster {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn port_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(100))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_millis(300)));
    let mut reply = [0u8; 5];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut reply).is_ok() && &reply == b"+PONG"
}

#[test]
fn cluster_script_restart_keeps_the_node_down_for_the_delay() {
    // README: `scripts/cluster.sh restart PORT DELAY_S` delays a node's
    // return. The script's ports are fixed (7001-7005); skip when anything
    // listens there (a Compose cluster, say), or when redis-server is absent.
    let ports = script_ports();
    if ports.iter().any(|&p| {
        std::net::TcpStream::connect(std::net::SocketAddr::from(([127, 0, 0, 1], p))).is_ok()
    }) || Command::new("redis-cli").arg("--version").output().is_err()
    {
        eprintln!("skipped: ports 7001-7005 in use, or no redis-cli");
        return;
    }
    let cluster = ScriptCluster {
        dir: std::env::temp_dir().join(format!("redlock-script-cluster-{}", std::process::id())),
    };
    let up = cluster.run(&["up"]);
    assert!(up.status.success(), "up: {up:?}");
    assert!(ports.iter().all(|&p| port_answers(p)), "all five up");

    let port = ports[2];
    let delay = std::time::Duration::from_secs(2);
    let start = std::time::Instant::now();
    let mut restart = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh"))
        .args(["restart", &port.to_string(), &delay.as_secs().to_string()])
        .env("REDLOCK_CLUSTER_DIR", &cluster.dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run restart");
    // down soon after the call, and it stays down for the delay
    let mut down_at = None;
    let mut back_at = None;
    while start.elapsed() < delay * 3 && back_at.is_none() {
        let answers = port_answers(port);
        match (down_at, answers) {
            (None, false) => down_at = Some(start.elapsed()),
            (Some(_), true) => back_at = Some(start.elapsed()),
            _ => {}
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(restart.wait().unwrap().success(), "restart failed");
    let down_at = down_at.expect("the node never went down");
    let back_at = back_at.expect("the node did not come back");
    assert!(
        down_at < std::time::Duration::from_secs(1),
        "went down after {down_at:?}"
    );
    assert!(
        back_at - down_at >= delay,
        "down for {:?} only, asked for {delay:?}",
        back_at - down_at
    );
    // the other nodes were not touched
    for &p in ports.iter().filter(|&&p| p != port) {
        assert!(port_answers(p), "node {p} went down");
    }
}
