//! The lock handle and the random token that proves ownership.

use std::borrow::Cow;
use std::fmt;
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
    let mut text = String::with_capacity(TOKEN_BYTES * 2);
    for b in bytes {
        use fmt::Write;
        let _ = write!(text, "{b:02x}");
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
/// One handle serves one resource or several: a lock from
/// [`Redlock::lock_many`](crate::Redlock::lock_many) holds every resource
/// of its set under one token, and `extend`, `unlock`, `verify`,
/// `fencing_token` and the watchdog act on the whole set at once.
/// [`resource`](Lock::resource) and [`key`](Lock::key) name the first
/// resource; [`resources`](Lock::resources) and [`keys`](Lock::keys) name
/// them all.
#[derive(Clone)]
pub struct Lock {
    /// The first (for a single-resource lock, the only) resource.
    pub(crate) resource: String,
    pub(crate) key: String,
    /// The other resources of a multi-resource lock with their keys, in the
    /// order given; empty for one resource (an empty `Vec` allocates
    /// nothing, so single locks pay 24 bytes for it).
    pub(crate) rest: Vec<(String, String)>,
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

impl PartialEq for Lock {
    /// Two locks are equal when they are the same grant (or extension) of the
    /// same token.
    fn eq(&self, other: &Self) -> bool {
        (
            &self.resource,
            &self.key,
            &self.rest,
            &self.token,
            self.started_at,
            self.expires_at,
        ) == (
            &other.resource,
            &other.key,
            &other.rest,
            &other.token,
            other.started_at,
            other.expires_at,
        )
    }
}

impl Eq for Lock {}

impl Lock {
    /// The resource name that was locked; for a lock on several resources,
    /// the first one given.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Every resource name the lock holds, in the order given: one for a
    /// lock from [`Redlock::lock`](crate::Redlock::lock), the whole set for
    /// one from [`Redlock::lock_many`](crate::Redlock::lock_many).
    pub fn resources(&self) -> impl Iterator<Item = &str> + Clone + '_ {
        std::iter::once(self.resource.as_str()).chain(self.rest.iter().map(|(r, _)| r.as_str()))
    }

    /// The Redis key that holds the lock: the manager's key prefix followed by
    /// the resource name. For a lock on several resources, the first one's.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Every Redis key the lock holds, in the order of
    /// [`resources`](Lock::resources).
    pub fn keys(&self) -> impl Iterator<Item = &str> + Clone + '_ {
        std::iter::once(self.key.as_str()).chain(self.rest.iter().map(|(_, k)| k.as_str()))
    }

    /// The keys as a list, for a request.
    pub(crate) fn key_list(&self) -> Vec<&str> {
        self.keys().collect()
    }

    /// The name errors and traces give the lock: the resource (borrowed, so
    /// a single lock's unlock allocates nothing for it), or the resources
    /// as [`keys::label`] names them.
    pub(crate) fn label(&self) -> Cow<'_, str> {
        if self.rest.is_empty() {
            return Cow::Borrowed(&self.resource);
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
        shown
            .field("resource", &self.resource)
            .field("key", &self.key);
        if !self.rest.is_empty() {
            let more: Vec<&str> = self.resources().skip(1).collect();
            shown.field("more", &more);
        }
        shown
            .field("token", &format_args!("{}…", &self.token[..8]))
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
            resource: "r".into(),
            key: "r".into(),
            rest: Vec::new(),
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
