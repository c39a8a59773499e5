//! The lock handle and the random token that proves ownership.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::inflight::InFlight;
use crate::protocol::error::Error;
use crate::protocol::keys;

/// Bytes of randomness in a token: 160 bits, as the Redlock spec asks.
const TOKEN_BYTES: usize = 20;

/// A fresh token: 160 bits from the operating system's CSPRNG, as 40
/// lowercase hex characters.
pub(crate) fn new_token() -> Result<String, Error> {
    use rand::TryRng;
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| Error::Entropy(e.to_string()))?;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(TOKEN_BYTES * 2);
    for b in bytes {
        text.push(char::from(HEX[usize::from(b >> 4)]));
        text.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    Ok(text)
}

/// A lock granted by a quorum of nodes.
///
/// It is a plain value: holding it renews nothing and dropping it releases
/// nothing. Release it with [`Redlock::unlock`](crate::Redlock::unlock),
/// extend it with [`Redlock::extend`](crate::Redlock::extend), or let it
/// expire. For work that may outlast the ttl, use
/// [`Redlock::acquire`](crate::Redlock::acquire) instead, which renews in the
/// background.
///
/// Its validity is measured on this process's monotonic clock from the
/// instant the first request of the round was sent, minus the clock drift
/// allowance; see [`validity`](Lock::validity).
///
/// One handle serves one resource or several: a lock on a set (any
/// [`Resources`](crate::Resources) with several names) holds every resource
/// under one token, and `extend`, `unlock`, `verify`, `fencing_token` and
/// the watchdog act on the whole set at once. [`resources`](Lock::resources)
/// and [`keys`](Lock::keys) list them, one for a single resource.
#[derive(Clone)]
pub struct Lock {
    /// Every resource with its key, in the order given (one for a single
    /// resource). Shared: the watchdog's and the extensions' copies of a
    /// lock clone a pointer.
    pub(crate) held: Arc<[Held]>,
    pub(crate) token: String,
    pub(crate) started_at: Instant,
    pub(crate) expires_at: Instant,
    /// The latest instant a key of this lock can still exist on a node whose
    /// clock runs at our rate (`Ttl::key_expiry`): how long a release is
    /// worth retrying.
    pub(crate) key_expiry: Instant,
    /// Requests of the rounds that made this lock that may still be running:
    /// a release or extension on a node waits for them.
    pub(crate) in_flight: InFlight,
    /// Rebuilt from a token by [`Redlock::adopt`](crate::Redlock::adopt):
    /// its validity is unknown here.
    pub(crate) adopted: bool,
}

/// One resource of a lock and the Redis key that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) resource: String,
    pub(crate) key: String,
}

impl Held {
    /// The resources `names` with their keys made by `key`.
    pub(crate) fn list(names: &[&str], key: impl Fn(&str) -> String) -> Arc<[Held]> {
        names
            .iter()
            .map(|name| Held {
                resource: (*name).to_owned(),
                key: key(name),
            })
            .collect()
    }
}

impl PartialEq for Lock {
    /// Two locks are equal when they are the same grant (or extension) of the
    /// same token.
    fn eq(&self, other: &Self) -> bool {
        (&self.held, &self.token, self.started_at, self.expires_at)
            == (
                &other.held,
                &other.token,
                other.started_at,
                other.expires_at,
            )
    }
}

impl Eq for Lock {}

impl Lock {
    /// Every resource name the lock holds, in the order given: one for a
    /// single resource, the whole set for several. To print them:
    /// `lock.resources().collect::<Vec<_>>()`.
    pub fn resources(&self) -> impl ExactSizeIterator<Item = &str> + Clone + '_ {
        self.held.iter().map(|h| h.resource.as_str())
    }

    /// Every Redis key the lock holds, in the order of
    /// [`resources`](Lock::resources): the manager's key prefix followed by
    /// the resource name.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + Clone + '_ {
        self.held.iter().map(|h| h.key.as_str())
    }

    /// The keys as a list, for a request.
    pub(crate) fn key_list(&self) -> Vec<&str> {
        self.keys().collect()
    }

    /// The name errors and traces give the lock: the resource (borrowed, so
    /// a single lock's unlock allocates nothing for it), or the resources
    /// as `keys::label` names them.
    pub(crate) fn label(&self) -> Cow<'_, str> {
        if let [one] = &self.held[..] {
            return Cow::Borrowed(&one.resource);
        }
        Cow::Owned(keys::label(&self.resources().collect::<Vec<_>>()).into_owned())
    }

    /// The random value stored in the key, as 40 hex characters. It proves
    /// ownership: only a holder of this token can release or extend the
    /// lock. Treat it like a secret.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The instant the round that granted (or last extended) this lock sent
    /// its first request.
    pub fn started_at(&self) -> Instant {
        self.started_at
    }

    /// The instant after which the lock must be considered lost:
    /// start of the round + ttl − drift allowance. For a lock rebuilt by
    /// [`Redlock::adopt`](crate::Redlock::adopt), the instant it was rebuilt:
    /// its validity is not known here.
    pub fn expires_at(&self) -> Instant {
        self.expires_at
    }

    /// Time left until [`expires_at`](Lock::expires_at), zero once it has
    /// passed.
    pub fn validity(&self) -> Duration {
        self.expires_at.saturating_duration_since(Instant::now())
    }

    /// Whether any validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.expires_at
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only a prefix of the token: a full token in a log line would let
        // anyone who reads the log release the lock.
        let mut shown = f.debug_struct("Lock");
        let resources: Vec<&str> = self.resources().collect();
        shown.field("resources", &resources);
        // By characters: an adopted token may be short, or not ASCII.
        let prefix: String = self.token.chars().take(8).collect();
        shown
            .field("token", &format_args!("{prefix}…"))
            .field("validity", &self.validity())
            .field("adopted", &self.adopted)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_160_bit_hex_and_fresh() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let t = new_token().unwrap();
            assert_eq!(t.len(), 40);
            assert!(
                t.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(seen.insert(t), "token repeated");
        }
    }

    #[test]
    fn debug_redacts_the_token() {
        let token = new_token().unwrap();
        let now = Instant::now();
        let lock = Lock {
            held: Held::list(&["r"], str::to_owned),
            token: token.clone(),
            started_at: now,
            expires_at: now,
            key_expiry: now,
            in_flight: InFlight::default(),
            adopted: false,
        };
        let shown = format!("{lock:?}");
        assert!(!shown.contains(&token), "{shown}");
        assert!(shown.contains(&token[..8]));
        assert!(!lock.is_valid());
        assert_eq!(lock.validity(), Duration::ZERO);
    }
}
