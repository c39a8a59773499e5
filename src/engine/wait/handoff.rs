//! The releaser's side of a hand-off; see the [module docs](super).

use std::sync::Arc;

use crate::engine::Inner;
use crate::protocol::request::handoff;
use crate::protocol::timing::HANDOFF_CHECK;

/// The releaser's side of a hand-off: after a release that named a
/// successor on some node (the unlock script answered 2, see
/// [`UNLOCK`](crate::protocol::scripts::UNLOCK)), waits [`HANDOFF_CHECK`] and then, on each node in
/// `nodes` (those that released), publishes the release again for every
/// manager where a key is still free and no later release of it named a
/// successor or found one ([`HANDOFF_CHECK`](crate::protocol::scripts::HANDOFF_CHECK)). A named manager that does not take the
/// lock (its process stopped: `PUBLISH` counted its connection; or none of
/// its waiters could use the release) then delays the others by about
/// [`HANDOFF_CHECK`], not until the next release or the holder's expiry.
///
/// Only contended releases pay for it (one script per node, later, off the
/// caller's path); an uncontended release names nobody. The check runs on
/// a task of the current runtime and holds the manager weakly: a manager
/// dropped, or a runtime shut down, within [`HANDOFF_CHECK`] of the
/// release sends none.
pub(crate) fn check_handoff(inner: &Arc<Inner>, nodes: &[usize], keys: &[&str], token: &str) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner = Arc::downgrade(inner);
    let nodes = nodes.to_vec();
    let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
    let token = token.as_bytes().to_vec();
    runtime.spawn(async move {
        tokio::time::sleep(HANDOFF_CHECK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let request = handoff::request(keys, token);
        let timeout = request.timeout(inner.config.node_timeout);
        let checks = nodes.iter().map(|&index| {
            crate::engine::round::call(
                inner.nodes[index].clone(),
                index,
                request.clone(),
                timeout,
                crate::engine::round::InFlight::default(),
                None,
                crate::engine::round::Prepared::default(),
            )
        });
        // Read only by the trace (a no-op without the `tracing` feature).
        #[allow(unused_variables)]
        let republished = futures::future::join_all(checks)
            .await
            .iter()
            .filter(|r| r.as_ref().is_ok_and(handoff::republished))
            .count();
        crate::trace::debug!(
            republished,
            "hand-off check: a release published again on the nodes where its key stayed free"
        );
    });
}
