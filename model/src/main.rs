//! `cargo run --release -- <mode>`; see README.md.
//!
//! Modes: `quick`, `exhaustive` (3 nodes, 2 clients, every state),
//! `three-clients` (3 nodes, 3 clients, 3 ticks, safety only, random walks
//! for SECONDS),
//! `random3` / `random5` (every nemesis, random walks for SECONDS, default
//! 120), `direct-extend` (an extend called directly, no watchdog: issue
//! 21's configuration, exhaustively; `direct-extend-live` with the liveness
//! oracle at 1 tick), `multi` (a single lock and a set sharing a key;
//! `multi-live`, `multi3` with a third client on K1 by random walks), the
//! shared fencing counter of issue 21: `shared-counter` (positive, random
//! walks), and the negative models `no-guard`, `incr`, `no-generation`,
//! `extend-no-recheck` (the extend grant before issue 21),
//! `resync-at-once`, `trust-missing`; Redis Clusters as nodes (issue 24):
//! `cluster-plain` (planted: plain agreement, a failover),
//! `cluster-plain-no-failover`, `cluster-acked` (acknowledged agreement,
//! CI's size), `cluster-acked-extend` (with a watchdog renewal),
//! `cluster-acked-failovers` (3 failovers), `cluster-acked-live` (the
//! liveness oracle), `cluster-random` (random walks), `cluster-acquire-only`
//! (planted: the extension not acknowledged), `mixed-plain`, `mixed-acked`,
//! `mixed-acked-crash` (two cluster nodes and a standalone one).
//! The guarded acquisition's pipeline (`SET`, then the marker's `GET`):
//! `pipelined` (against a flush), and the planted violation
//! `check-before` (the marker read first).
//! The release gate of the waiting protocol (`src/gate.rs`): `gate`
//! (broadcast wake-ups), `gate-named` (a named successor), and the planted
//! violations `gate-no-recreate` (`NAMED=1` for the named variant),
//! `gate-confirm-early`, `gate-lapse` (the renewal nemesis: the documented
//! degradation; `gate-lapse-relink` with the suggested remedy),
//! `gate-subscribe-unawaited`, `gate-drop-early-wake`, `gate-named-no-check`.
use redlock_model::gate::{self, GateCfg, Wake};
use redlock_model::{
    Agreement, Cfg, Fencing, MarkerCheck, Replication, Resync, Run, Search, check,
};

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "quick".into());
    let seconds = std::env::var("SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    if mode.starts_with("gate") {
        return gate_mode(&mode);
    }
    let random = Search::Random { seed: 1, seconds };
    let (cfg, search, stop) = match mode.as_str() {
        "exhaustive" => (Cfg::exhaustive(), Search::Bfs, None),
        "random3" => (Cfg::all_faults(3), random, None),
        // Three clients (safety only): by random walks; exhaustively it
        // passed 12 GB of fingerprints in 10 minutes without finishing.
        "three-clients" => (
            Cfg {
                clients: 3,
                max_time: 3,
                liveness: false,
                ..Cfg::quick()
            },
            random,
            None,
        ),
        "random5" => (Cfg::all_faults(5), random, None),
        "direct-extend" => (
            Cfg {
                liveness: false,
                ..Cfg::direct_extend()
            },
            Search::Bfs,
            None,
        ),
        "direct-extend-live" => (
            Cfg {
                max_time: 1,
                losses: 1,
                ..Cfg::direct_extend()
            },
            Search::Bfs,
            None,
        ),
        "direct-extend-loss" => (
            Cfg {
                max_time: 2,
                losses: 1,
                liveness: false,
                ..Cfg::direct_extend()
            },
            Search::Bfs,
            None,
        ),
        "extend-no-recheck" => (
            Cfg::extend_without_recheck(),
            Search::Bfs,
            Some("tenure continuity"),
        ),
        "multi" => (
            Cfg {
                liveness: false,
                ..Cfg::multi()
            },
            Search::Bfs,
            None,
        ),
        "multi-live" => (
            Cfg {
                max_time: 1,
                ..Cfg::multi()
            },
            Search::Bfs,
            None,
        ),
        "multi-direct" => (
            Cfg {
                watchdog: false,
                losses: 0,
                liveness: false,
                ..Cfg::multi()
            },
            Search::Bfs,
            None,
        ),
        "multi-direct-loss" => (
            Cfg {
                watchdog: false,
                liveness: false,
                ..Cfg::multi()
            },
            Search::Bfs,
            None,
        ),
        "multi3" => (
            Cfg {
                clients: 3,
                keys: vec![0b01, 0b11, 0b10],
                max_time: 3,
                liveness: false,
                ..Cfg::multi()
            },
            random,
            None,
        ),
        "no-guard" => (Cfg::no_guard(), Search::Bfs, Some("mutual exclusion")),
        "incr" => (
            Cfg::incr_no_write_back(),
            Search::Dfs { max_depth: 40 },
            Some("fencing tokens increase"),
        ),
        "no-generation" => (
            Cfg::fencing_without_generations(),
            Search::Bfs,
            Some("fencing tokens increase"),
        ),
        "no-generation-fixed" => (
            Cfg {
                fencing: Fencing::Generation,
                ..Cfg::fencing_without_generations()
            },
            Search::Bfs,
            None,
        ),
        // Random walks: a BFS did not finish in 15 minutes here.
        "shared-counter" => (Cfg::shared_counter(), random, None),
        "shared-counter-bfs" => (Cfg::shared_counter(), Search::Bfs, None),
        "resync-at-once" => (
            Cfg {
                resync: Resync::Always,
                symmetry: false,
                ..Cfg::shared_counter()
            },
            random,
            Some("fencing tokens increase"),
        ),
        "trust-missing" => (
            Cfg {
                resync: Resync::MissingTrusted,
                other_fences: 0,
                symmetry: false,
                ..Cfg::shared_counter()
            },
            Search::Bfs,
            Some("fencing tokens increase"),
        ),
        // Issue 24: Redis Clusters as nodes; sizes in README.md.
        "cluster-plain" => (
            Cfg {
                symmetry: false,
                ..Cfg::cluster(Agreement::Plain)
            },
            Search::Bfs,
            Some("mutual exclusion"),
        ),
        "cluster-plain-no-failover" => (
            Cfg {
                failovers: 0,
                ..Cfg::cluster(Agreement::Plain)
            },
            Search::Bfs,
            None,
        ),
        "cluster-acked" => (Cfg::cluster(Agreement::Acknowledged), Search::Bfs, None),
        "cluster-acked-extend" => (
            Cfg {
                extends: 1,
                ..Cfg::cluster(Agreement::Acknowledged)
            },
            Search::Bfs,
            None,
        ),
        "cluster-acked-failovers" => (
            Cfg {
                failovers: 3,
                ..Cfg::cluster(Agreement::Acknowledged)
            },
            Search::Bfs,
            None,
        ),
        "cluster-acked-live" => (
            Cfg {
                max_time: 1,
                liveness: true,
                ..Cfg::cluster(Agreement::Acknowledged)
            },
            Search::Bfs,
            None,
        ),
        "cluster-random" => (
            Cfg {
                max_time: 4,
                extends: 1,
                failovers: 3,
                ..Cfg::cluster(Agreement::Acknowledged)
            },
            random,
            None,
        ),
        "cluster-acquire-only" => (
            Cfg {
                extends: 1,
                ..Cfg::cluster(Agreement::AcquireOnly)
            },
            Search::Bfs,
            Some("mutual exclusion"),
        ),
        "mixed-plain" => (
            Cfg {
                symmetry: false,
                ..Cfg::mixed(Agreement::Plain)
            },
            Search::Bfs,
            Some("mutual exclusion"),
        ),
        "mixed-acked" => (Cfg::mixed(Agreement::Acknowledged), Search::Bfs, None),
        "mixed-acked-crash" => (
            Cfg {
                crashes: 1,
                ..Cfg::mixed(Agreement::Acknowledged)
            },
            Search::Bfs,
            None,
        ),
        "pipelined" => (Cfg::pipelined(), Search::Bfs, None),
        "check-before" => (Cfg::check_before(), Search::Bfs, Some("mutual exclusion")),
        _ => (Cfg::quick(), Search::Bfs, None),
    };
    // Overrides for measuring sizes: TICKS (max_time), SYMMETRY and FAST
    // (fast node clocks) and LIVENESS (0 or 1), MARKER (0: the script, 1:
    // the pipeline, 2: the marker read first),
    // LOSSES, EXTENDS, FAILOVERS, CRASHES (budgets), CLUSTERS (how many of
    // the nodes are cluster nodes), STEPWISE (1: `Replication::Stepwise`).
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u8>().ok());
    let mut cfg = cfg;
    if let Some(t) = env("TICKS") {
        cfg.max_time = t;
    }
    if let Some(v) = env("SYMMETRY") {
        cfg.symmetry = v == 1;
    }
    if let Some(v) = env("LOSSES") {
        cfg.losses = v;
    }
    if let Some(v) = env("EXTENDS") {
        cfg.extends = v;
    }
    if let Some(v) = env("FAST") {
        cfg.fast_clocks = v == 1;
    }
    if let Some(v) = env("STEPWISE") {
        cfg.replication = if v == 1 {
            Replication::Stepwise
        } else {
            Replication::Deferred
        };
    }
    if let Some(v) = env("FAILOVERS") {
        cfg.failovers = v;
    }
    if let Some(v) = env("CRASHES") {
        cfg.crashes = v;
    }
    if let Some(v) = env("LIVENESS") {
        cfg.liveness = v == 1;
    }
    if let Some(v) = env("FLUSHES") {
        cfg.flushes = v;
    }
    if let Some(v) = env("MARKER") {
        cfg.marker_check = match v {
            0 => MarkerCheck::Script,
            1 => MarkerCheck::After,
            _ => MarkerCheck::Before,
        };
    }
    if let Some(v) = env("CLUSTERS") {
        cfg.cluster_nodes = v.into();
    }
    println!("{mode}: {cfg:?}");
    let r = check(cfg, search, 2, stop);
    print_run(&r, stop);
}

/// The release gate's modes (`src/gate.rs`), by BFS: an exhaustive run
/// (two threads), then, for each property a mode must fail, a run on one
/// thread that stops at its first (shortest) counterexample. `MANAGERS`,
/// `WAITS`, `TURNS` (the holder's acquisitions), `NAMED` (0 or 1) and
/// `SYMMETRY` override the configuration.
fn gate_mode(mode: &str) {
    use gate::{GATE_OPEN, NOT_STRANDED};
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u8>().ok());
    let named = env("NAMED") == Some(1);
    let wake = if named { Wake::Named } else { Wake::Broadcast };
    let both = &[NOT_STRANDED, GATE_OPEN][..];
    let (mut cfg, exhaustive, fails) = match mode {
        "gate" => (GateCfg::design(Wake::Broadcast), true, &[][..]),
        "gate-named" => (GateCfg::design(Wake::Named), true, &[][..]),
        "gate-no-recreate" => (GateCfg::no_recreate(wake), false, both),
        "gate-confirm-early" => (GateCfg::confirm_early(), false, both),
        "gate-lapse" => (GateCfg::lapse(), false, both),
        "gate-lapse-relink" => (GateCfg::lapse_relink(), true, &[GATE_OPEN][..]),
        "gate-subscribe-unawaited" => (GateCfg::subscribe_unawaited(), false, both),
        "gate-drop-early-wake" => (GateCfg::drop_early_wake(), true, &[NOT_STRANDED][..]),
        "gate-named-no-check" => (GateCfg::named_without_check(), true, &[NOT_STRANDED][..]),
        other => panic!("unknown mode {other}"),
    };
    if let Some(v) = env("MANAGERS") {
        cfg.managers = v.into();
    }
    if let Some(v) = env("WAITS") {
        cfg.waits = v;
    }
    if let Some(v) = env("TURNS") {
        cfg.holder_turns = v;
    }
    if let Some(v) = env("SYMMETRY") {
        cfg.symmetry = v == 1;
    }
    println!("{mode}: {cfg:?}");
    if exhaustive {
        let r = gate::check(cfg.clone(), Search::Bfs, 2, None);
        if fails.is_empty() {
            print_run(&r, None);
        } else {
            // Its traces of the failing properties are the last ones
            // stateright met (`check_model`): the runs below show the
            // shortest.
            println!(
                "exhaustive: unique states {}, {:.1} s, exhausted: {}; found: {:?}",
                r.unique_states,
                r.seconds,
                r.exhausted,
                r.discoveries.iter().map(|(n, _)| *n).collect::<Vec<_>>()
            );
        }
    }
    for &property in fails {
        println!("-- the first counterexample to \"{property}\"");
        let r = gate::check(cfg.clone(), Search::Bfs, 1, Some(property));
        let trace = r.found(property).unwrap_or("none found");
        println!(
            "unique states {}, {:.1} s\n{trace}",
            r.unique_states, r.seconds
        );
    }
}

fn print_run(r: &Run, stop: Option<&str>) {
    let stopped = stop.is_some_and(|p| r.found(p).is_some());
    println!(
        "unique states {}, max depth {}, {:.1} s, exhausted: {}{}",
        r.unique_states,
        r.max_depth,
        r.seconds,
        r.exhausted,
        if stopped {
            " (stopped at the first counterexample)"
        } else {
            ""
        }
    );
    for (name, trace) in &r.discoveries {
        println!("== {name}\n{trace}");
    }
}
