//! Releasing a lock on every node: the ownership-checked release round, the
//! background retry for nodes that could not be reached, and the guard that
//! releases a cancelled attempt.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::quorum::{self, Tally, Until};
use crate::redlock::Inner;
use crate::scripts;

/// Sends the ownership-checked release to every node and waits for all of
/// them, each bounded by the node timeout.
///
/// Nodes that could not be reached may still hold the key (a SET whose reply
/// was lost with its connection, say), which would keep others out until it
/// expires; a background task keeps trying those nodes until `key_expiry`.
pub(crate) async fn release(
    inner: &Arc<Inner>,
    key: &str,
    token: &str,
    key_expiry: Instant,
) -> Tally {
    let tally = quorum::round(
        &inner.nodes,
        inner.config.node_timeout,
        Until::AllNodes,
        |mut conn| {
            let mut call = scripts::UNLOCK.key(key);
            call.arg(token);
            async move { call.invoke_async(&mut conn).await }
        },
        quorum::accept_script,
    )
    .await;
    if !tally.unanswered.is_empty() && Instant::now() < key_expiry {
        tokio::spawn(retry_release(
            inner.clone(),
            key.to_owned(),
            token.to_owned(),
            tally.unanswered.clone(),
            key_expiry,
        ));
    }
    tally
}

/// Retries the release on the given nodes, with a doubling pause (from the
/// node timeout up to one second), until each answered or the key expired.
async fn retry_release(
    inner: Arc<Inner>,
    key: String,
    token: String,
    mut pending: Vec<usize>,
    key_expiry: Instant,
) {
    let node_timeout = inner.config.node_timeout;
    let mut pause = node_timeout;
    while !pending.is_empty() {
        tokio::time::sleep(pause).await;
        if Instant::now() >= key_expiry {
            return;
        }
        pause = (pause * 2).min(Duration::from_secs(1));
        let attempts = pending.iter().map(|&i| {
            let (key, token) = (&key, &token);
            let node = &inner.nodes[i];
            async move {
                let Ok(mut conn) = node.connection() else {
                    return Some(i);
                };
                let mut call = scripts::UNLOCK.key(key);
                call.arg(token);
                match tokio::time::timeout(node_timeout, call.invoke_async::<i64>(&mut conn)).await
                {
                    Ok(Ok(_)) => None,
                    _ => Some(i),
                }
            }
        });
        pending = futures::future::join_all(attempts)
            .await
            .into_iter()
            .flatten()
            .collect();
    }
}

/// Releases an attempt from a spawned task when the attempt's future is
/// dropped before it was granted or released.
pub(crate) struct Cleanup {
    pub(crate) inner: Option<(Arc<Inner>, String, String)>,
    pub(crate) key_expiry: Instant,
}

impl Cleanup {
    pub(crate) fn disarm(&mut self) {
        self.inner = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some((inner, key, token)) = self.inner.take() else {
            return;
        };
        // Drop must not block: hand the release to the runtime. Without a
        // runtime (the future was polled on one that is gone) the keys expire
        // with their ttl.
        let key_expiry = self.key_expiry;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                release(&inner, &key, &token, key_expiry).await;
            });
        }
    }
}
