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
