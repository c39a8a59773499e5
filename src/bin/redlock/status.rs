//! `redlock status`: whether a lock is held, node by node, read with plain
//! `PTTL` requests. It never reads the key's value, so it cannot print a
//! token.

use std::io::Write;
use std::time::Duration;

use redlock_quorum::Redlock;

use crate::args::StatusArgs;
use crate::exit::{self, Failure};

/// What one node said about the key.
enum Seen {
    /// The key is there, expiring in this long.
    Held(Duration),
    /// The key is there without an expiry: not a lock of a Redlock client.
    NoExpiry,
    Free,
    Failed(String),
}

/// Prints the lock's state; returns 0 when a quorum holds it, 1 when not.
pub(crate) async fn status(args: StatusArgs) -> Result<u8, Failure> {
    let urls = args.nodes.urls()?;
    // The library validates the list (and names the bad entry without its
    // password) and gives each node's label without credentials.
    let redlock = Redlock::new(urls.iter().map(String::as_str)).map_err(Failure::config)?;
    let timeout = args.nodes.node_timeout.max(Duration::from_secs(1));
    let seen =
        futures::future::join_all(urls.iter().map(|url| pttl(url, &args.name, timeout))).await;

    let held = seen
        .iter()
        .filter(|s| matches!(s, Seen::Held(_) | Seen::NoExpiry))
        .count();
    let failed = seen.iter().filter(|s| matches!(s, Seen::Failed(_))).count();
    let quorum = redlock.quorum();
    let nodes = redlock.node_count();
    let (verdict, code) = if held >= quorum {
        ("held", 0)
    } else if held + failed >= quorum {
        ("unknown", exit::UNAVAILABLE)
    } else if held == 0 {
        ("free", exit::NOT_HELD)
    } else {
        ("not held (too few nodes hold the key)", exit::NOT_HELD)
    };
    // The report is written at once, and a failed write (a closed pipe, a
    // full disk) is not an error of the lock's: the exit code still says
    // what was found. `println!` would panic instead.
    let mut report = format!(
        "{:?}: {verdict}: on {held} of {nodes} nodes ({quorum} make a quorum){}\n",
        args.name,
        if failed > 0 {
            format!(", {failed} failed")
        } else {
            String::new()
        }
    );
    let width = redlock.nodes().map(str::len).max().unwrap_or(0);
    for (label, seen) in redlock.nodes().zip(&seen) {
        let state = match seen {
            Seen::Held(ttl) => format!("held, expires in {}", format_ms(*ttl)),
            Seen::NoExpiry => "held, no expiry (not a Redlock key)".to_owned(),
            Seen::Free => "free".to_owned(),
            Seen::Failed(e) => format!("FAILED: {e}"),
        };
        report.push_str(&format!("  {label:width$}  {state}\n"));
    }
    let _ = std::io::stdout().lock().write_all(report.as_bytes());
    Ok(code)
}

/// `PTTL key` on one node, on a connection of its own, within `timeout`:
/// on a cluster node (`redis+cluster://`), on the master of the key's slot.
async fn pttl(url: &str, key: &str, timeout: Duration) -> Seen {
    let ask = async {
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(key);
        match cluster_seeds(url) {
            Some(seeds) => {
                let client = redis::cluster::ClusterClient::new(seeds)?;
                let mut con = client.get_async_connection().await?;
                cmd.query_async::<i64>(&mut con).await
            }
            None => {
                let client = redis::Client::open(url)?;
                let mut con = client.get_multiplexed_async_connection().await?;
                cmd.query_async::<i64>(&mut con).await
            }
        }
    };
    match tokio::time::timeout(timeout, ask).await {
        Err(_) => Seen::Failed(format!("no answer within {}", format_ms(timeout))),
        Ok(Err(e)) => Seen::Failed(e.to_string()),
        Ok(Ok(-2)) => Seen::Free,
        Ok(Ok(-1)) => Seen::NoExpiry,
        Ok(Ok(ms)) => Seen::Held(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
    }
}

/// The seeds of a cluster node's URL (`redis+cluster://[cred@]h:p,h:p/`)
/// as plain URLs, each with the credentials; `None` for any other URL.
fn cluster_seeds(url: &str) -> Option<Vec<String>> {
    let rest = url
        .strip_prefix("redis+cluster://")
        .or_else(|| url.strip_prefix("valkey+cluster://"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((c, h)) => (format!("{c}@"), h),
        None => (String::new(), authority),
    };
    Some(
        hosts
            .split(',')
            .map(|host| format!("redis://{credentials}{}/", host.trim()))
            .collect(),
    )
}

fn format_ms(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
