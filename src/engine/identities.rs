//! Which server each node of a manager is, to refuse one server named
//! twice.

use std::collections::HashMap;
use std::sync::Mutex;

/// Which server each node of one manager turned out to be: its `run_id`,
/// learned on each connection. Two entries of the node list that reach the
/// same server (by two names, or two databases of it) are one failure
/// domain, and counting both would let one server grant a quorum alone.
#[derive(Debug, Default)]
pub(crate) struct Identities {
    by_run_id: Mutex<HashMap<String, (usize, String)>>,
}

impl Identities {
    /// Records that node `index` (`label`) is the server `run_id`; on a
    /// clash, the other entry's index and label.
    pub(crate) fn register(
        &self,
        index: usize,
        label: &str,
        run_id: &str,
    ) -> Result<(), (usize, String)> {
        if run_id.is_empty() {
            // A server (or proxy) that hides its run id cannot be compared.
            return Ok(());
        }
        let mut map = self.by_run_id.lock().unwrap_or_else(|e| e.into_inner());
        // A node that restarted has a new run id: forget its old one.
        map.retain(|_, (i, _)| *i != index);
        match map.get(run_id) {
            Some(other) => Err(other.clone()),
            None => {
                map.insert(run_id.to_owned(), (index, label.to_owned()));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_under_two_entries_is_detected() {
        let ids = Identities::default();
        assert_eq!(ids.register(0, "x:1", "a"), Ok(()));
        assert_eq!(ids.register(1, "y:1", "b"), Ok(()));
        assert_eq!(ids.register(2, "z:1", "a"), Err((0, "x:1".to_owned())));
        // node 0 restarted: a new run id, and "a" is free again
        assert_eq!(ids.register(0, "x:1", "c"), Ok(()));
        assert_eq!(ids.register(2, "z:1", "a"), Ok(()));
        // no run id: nothing to compare
        assert_eq!(ids.register(1, "y:1", ""), Ok(()));
        assert_eq!(ids.register(2, "z:1", ""), Ok(()));
    }
}
