//! Starting a node's link task ([`super::link`]) where none runs: at a
//! waiter's registration, and before each of its sleeps.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::link;
use super::state::{Shared, State, Status};

/// Starts the link task of every node that has none running (none yet, or
/// it died with the runtime it ran on): when a waiter registers, and
/// before each of its sleeps, on the waiter's runtime.
pub(super) fn ensure_links(shared: &Arc<Shared>, state: &mut State) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    for index in 0..state.links.len() {
        if state.links[index]
            .task
            .as_ref()
            .is_some_and(|t| !t.is_finished())
        {
            continue;
        }
        // A new task knows no subscription of the old one.
        for channel in state.channels.values_mut() {
            channel.subscribed[index] = false;
        }
        let (bell, changes) = mpsc::channel(1);
        let link = &mut state.links[index];
        let restarted = link.task.is_some();
        link.bell = Some(bell);
        link.dirty.clear();
        link.resync = false;
        link.status = Status::Connecting;
        link.task = Some(runtime.spawn(link::run_link(
            Arc::downgrade(shared),
            index,
            changes,
            restarted,
        )));
    }
}
