//! Locks on several resources at once, all or nothing, on one quorum.
//!
//! # The handle
//! A lock on several resources is a [`Lock`] like any other: it carries the
//! first resource and key as a single lock does, and the others in
//! `Lock::rest` (empty for one resource). One token holds every key, so
//! `extend`, `unlock`, `verify`, `fencing_token` and the watchdog need no
//! second type: each builds its request from the lock's keys, with the
//! single-key script for one key and the `*_MANY` script of
//! [`crate::protocol::scripts`] for several.
//!
//! # The rule
//! On each node one script sets every key or none (`ACQUIRE_MANY`), so a
//! node agrees only when it set the whole set, and the quorum rule of the
//! [`tally`](crate::protocol::tally) applies to the set as it does to one key. Two
//! requests whose sets overlap cannot both reach a quorum, and no request
//! ever holds part of its set while it waits for the rest: deadlock is
//! impossible by construction, whatever order the names come in.
//!
//! # Fencing
//! One counter per resource, as for single locks. A multi-lock's fencing
//! token is the largest of its resources' counters (read on a quorum) plus
//! one, written back to every resource's counter: it is larger than any
//! token given before on any of its resources, and any later holder of any
//! of them, alone or in a set, gets a larger one.
//!
//! # The limit
//! Redis puts no useful limit on the number of keys of one script (a
//! command may carry up to 2^31 − 1 arguments, and the scripts loop over
//! `KEYS` rather than `unpack` it). What bounds a set is time: each node
//! runs the script in one go, blocking every other client of that node
//! meanwhile, and the round must hear a quorum within the node timeout,
//! which grows by 1 ms per key past the first for such a request
//! ([`crate::engine::round`]). [`MAX_RESOURCES`] caps a request well below where
//! that bites (its docs give the numbers).
//!
//! A release that a node did not answer is owed to it once for the whole
//! set, and retried with the set's script ([`crate::engine::release`]).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::{Cmd, Script, Value};

use crate::api::guard::LockGuard;
use crate::engine::acquire::{Patience, Redlock};
use crate::engine::lock::Lock;
use crate::engine::round::Request;
use crate::protocol::error::Error;
use crate::protocol::generation::Generation;
use crate::protocol::scripts;
use crate::protocol::tally::Reply;
use crate::protocol::timing;

/// The most resources one lock may hold.
///
/// Redis itself would take far more keys in one script; the cap is set by
/// time. Each node runs a lock's script in one go, blocking its other
/// clients meanwhile, and the time grows with the keys: measured with 3
/// local nodes on a 2-core machine, one acquisition round over 1,000 keys
/// took 13 ms, over 5,000 63 ms, and 10,000 never reached a quorum within
/// the default 50 ms node timeout (with a 30 s node timeout, 226 ms). The
/// release costs the most per key when other managers wait for the keys:
/// it names a successor and publishes for each key (5 to 7 ms for 1,000
/// keys on an idle node, 70 to 100 ms under a load of 15). So each request
/// gets 1 ms per key past the first on top of the node timeout (see
/// [`RedlockBuilder::node_timeout`](crate::RedlockBuilder::node_timeout)),
/// and lock, extend, fencing and unlock of 1,000 resources succeed with the
/// default timeouts while another manager waits for them (the README's
/// table on sets gives the times at 1, 10, 100 and 1,000 resources).
/// 1,000 keeps a round well inside those bounds.
pub const MAX_RESOURCES: usize = 1_000;

/// How many names a label spells out before it counts the rest.
const LABEL_NAMES: usize = 4;

/// The name errors and traces give a set of resources: the resource itself
/// for one, the names joined by `", "` for several, and past four names,
/// the first four and how many more (`"a, b, c, d and 996 more"`).
pub(crate) fn label<'a>(resources: &[&'a str]) -> Cow<'a, str> {
    match resources {
        [one] => Cow::Borrowed(one),
        several if several.len() <= LABEL_NAMES => Cow::Owned(several.join(", ")),
        several => Cow::Owned(format!(
            "{} and {} more",
            several[..LABEL_NAMES].join(", "),
            several.len() - LABEL_NAMES
        )),
    }
}

/// Checks the names of an acquisition: at least one, none empty, none
/// twice, at most [`MAX_RESOURCES`].
pub(crate) fn check_resources(resources: &[&str]) -> Result<(), Error> {
    match resources {
        [] => return Err(Error::NoResources),
        [""] => return Err(Error::EmptyResource),
        [_] => return Ok(()),
        _ => {}
    }
    if resources.len() > MAX_RESOURCES {
        return Err(Error::TooManyResources {
            count: resources.len(),
            max: MAX_RESOURCES,
        });
    }
    let mut seen = HashSet::with_capacity(resources.len());
    for resource in resources {
        if resource.is_empty() {
            return Err(Error::EmptyResource);
        }
        if !seen.insert(*resource) {
            return Err(Error::DuplicateResource {
                resource: (*resource).to_owned(),
            });
        }
    }
    Ok(())
}

/// A script request over a lock's keys: `one` for a single key, `many` for
/// several.
pub(crate) fn script(
    one: &'static LazyLock<Script>,
    many: &'static LazyLock<Script>,
    keys: &[&[u8]],
    args: &[&[u8]],
) -> Request {
    let script: &'static Script = if keys.len() == 1 { one } else { many };
    Request::Script {
        script,
        keys: keys.iter().map(|k| k.to_vec()).collect(),
        args: args.iter().map(|a| a.to_vec()).collect(),
    }
}

/// A request for a script made by [`crate::protocol::generation::with_marker`]: the keys and
/// arguments, then the marker key and the manager's candidate id.
fn marked(
    generation: &Generation,
    script: &'static LazyLock<Script>,
    keys: &[&[u8]],
    args: &[&[u8]],
) -> Request {
    let mut keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
    let mut args: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
    generation.append(&mut keys, &mut args);
    Request::Script {
        script,
        keys: keys.into(),
        args: args.into(),
    }
}

/// The request of an acquisition round: `SET key token NX PX ttl GET` for
/// one key, [`scripts::ACQUIRE_MANY`] for several; under the restart guard,
/// the same with the generation marker.
pub(crate) fn acquire_request(
    generation: &Generation,
    keys: &[String],
    token: &str,
    millis: u64,
) -> Request {
    let guarded = generation.guard.is_some();
    if let ([key], false) = (keys, guarded) {
        let mut set = Cmd::new();
        set.arg("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(millis)
            .arg("GET");
        return Request::Cmd(Arc::new(set));
    }
    let millis = millis.to_string();
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let args = [token.as_bytes(), millis.as_bytes()];
    match (keys.len(), guarded) {
        (1, _) => marked(generation, &scripts::SET_MARKED, &keys, &args),
        (_, true) => marked(generation, &scripts::ACQUIRE_MANY_MARKED, &keys, &args),
        (_, false) => script(&scripts::ACQUIRE_MANY, &scripts::ACQUIRE_MANY, &keys, &args),
    }
}

/// How the reply of [`acquire_request`] is read.
pub(crate) fn read_acquire<'a>(
    generation: &'a Generation,
    token: &'a str,
    several: bool,
) -> impl Fn(&Value) -> Result<Reply, String> + 'a {
    let body = move |value: &Value| {
        if several {
            scripts::read_acquire_many(token)(value)
        } else {
            scripts::read_set(token)(value)
        }
    };
    either(generation, body)
}

/// Reads a reply with `body`, through the marker's reader when the restart
/// guard is on (the requests then carry the marker).
fn either<'a, F>(generation: &Generation, body: F) -> impl Fn(&Value) -> Result<Reply, String> + 'a
where
    F: Fn(&Value) -> Result<Reply, String> + Copy + 'a,
{
    let marked = generation.reader(body);
    let guarded = generation.guard.is_some();
    move |value| if guarded { marked(value) } else { body(value) }
}

/// The extension request of a lock: [`scripts::EXTEND`] or
/// [`scripts::EXTEND_MANY`], with the generation marker under the restart
/// guard.
pub(crate) fn extend_request(generation: &Generation, lock: &Lock, millis: u64) -> Request {
    let millis = millis.to_string();
    let keys: Vec<&[u8]> = lock.keys().map(str::as_bytes).collect();
    let args = [lock.token.as_bytes(), millis.as_bytes()];
    match (keys.len(), generation.guard.is_some()) {
        (_, false) => script(&scripts::EXTEND, &scripts::EXTEND_MANY, &keys, &args),
        (1, true) => marked(generation, &scripts::EXTEND_MARKED, &keys, &args),
        (_, true) => marked(generation, &scripts::EXTEND_MANY_MARKED, &keys, &args),
    }
}

/// How the reply of [`extend_request`] is read.
pub(crate) fn read_extend(generation: &Generation) -> impl Fn(&Value) -> Result<Reply, String> {
    either(generation, scripts::read_extend)
}

/// The remote check of a lock: [`scripts::CHECK`] or
/// [`scripts::CHECK_MANY`], with the generation marker under the restart
/// guard. Read by [`read_check`].
pub(crate) fn check_request(generation: &Generation, lock: &Lock) -> Request {
    let keys: Vec<&[u8]> = lock.keys().map(str::as_bytes).collect();
    let args = [lock.token.as_bytes()];
    match (keys.len(), generation.guard.is_some()) {
        (_, false) => script(&scripts::CHECK, &scripts::CHECK_MANY, &keys, &args),
        (1, true) => marked(generation, &scripts::CHECK_MARKED, &keys, &args),
        (_, true) => marked(generation, &scripts::CHECK_MANY_MARKED, &keys, &args),
    }
}

/// How the reply of [`check_request`] is read.
pub(crate) fn read_check(generation: &Generation) -> impl Fn(&Value) -> Result<Reply, String> {
    either(generation, scripts::read_flag)
}

/// The release of keys held by `token`: [`scripts::UNLOCK`] or
/// [`scripts::UNLOCK_MANY`]; `quiet` leaves the release unpublished (see
/// [`scripts::UNLOCK`]).
pub(crate) fn unlock_request(keys: &[&str], token: &str, quiet: bool) -> Request {
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let args: &[&[u8]] = if quiet {
        &[token.as_bytes(), b"quiet"]
    } else {
        &[token.as_bytes()]
    };
    script(&scripts::UNLOCK, &scripts::UNLOCK_MANY, &keys, args)
}

/// The fencing read (`number` = `None`) or write of a lock: the lock keys,
/// then their legacy counter keys, then the node's counter, then the
/// generation marker ([`scripts::FENCE_READ`], [`scripts::FENCE_WRITE`],
/// for one key or several). The write names the generations it may trust
/// the counter in (`trust`). Their replies are read by
/// [`Generation::reader`] over [`scripts::read_fence`] and
/// [`scripts::read_flag`].
pub(crate) fn fence_request(
    generation: &Generation,
    prefix: &str,
    lock: &Lock,
    number: Option<(u64, &[Vec<u8>])>,
) -> Request {
    let legacy: Vec<Vec<u8>> = lock.keys().map(scripts::legacy_fence_key).collect();
    let counter = scripts::fence_key(prefix);
    let keys: Vec<&[u8]> = lock
        .keys()
        .map(str::as_bytes)
        .chain(legacy.iter().map(Vec::as_slice))
        .chain([counter.as_slice()])
        .collect();
    match number {
        None => marked(
            generation,
            &scripts::FENCE_READ,
            &keys,
            &[lock.token.as_bytes()],
        ),
        Some((number, trust)) => {
            let number = number.to_string();
            let args: Vec<&[u8]> = [lock.token.as_bytes(), number.as_bytes()]
                .into_iter()
                .chain(trust.iter().map(Vec::as_slice))
                .collect();
            marked(generation, &scripts::FENCE_WRITE, &keys, &args)
        }
    }
}

impl Redlock {
    /// Acquires every resource of `resources` for `ttl`, all or nothing,
    /// with the retries of [`lock`](Redlock::lock).
    ///
    /// Each attempt runs one script per node that sets every key (the key
    /// prefix followed by each name, as for [`lock`](Redlock::lock)) to one
    /// token, or none when any of them is held by someone else. A node
    /// agrees only when it set the whole set, and the lock is granted when
    /// a quorum agreed: the rule of a single lock, applied to the set. So
    /// two requests whose sets overlap exclude each other, a single lock on
    /// one of the resources excludes a set that contains it, and since no
    /// request ever holds part of its set while waiting for the rest, there
    /// is no deadlock whatever order the names come in. The layout and the
    /// all-or-nothing rule are node-redlock's, so its `acquire([a, b], ttl)`
    /// and this exclude each other too.
    ///
    /// The returned [`Lock`] holds the whole set:
    /// [`extend`](Redlock::extend), [`unlock`](Redlock::unlock),
    /// [`verify`](Redlock::verify) and
    /// [`fencing_token`](Redlock::fencing_token) act on every resource at
    /// once. A slice of one name is the same as [`lock`](Redlock::lock).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// // A transfer needs both accounts; nobody can hold one and wait for
    /// // the other.
    /// let lock = redlock
    ///     .lock_many(&["account:17", "account:42"], Duration::from_secs(5))
    ///     .await?;
    /// // ... move the money, within lock.validity() ...
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), where an error names the resources
    /// joined by `", "` (past four, the first four and how many more).
    /// Before anything is sent: [`Error::NoResources`] for an empty list,
    /// [`Error::DuplicateResource`] for a name given twice,
    /// [`Error::EmptyResource`] for an empty name and
    /// [`Error::TooManyResources`] past [`MAX_RESOURCES`].
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key
    /// behind longer than needed.
    pub async fn lock_many(&self, resources: &[&str], ttl: Duration) -> Result<Lock, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.lock_patiently(resources, ttl, patience).await
    }

    /// Acquires every resource of `resources` with one attempt: the set of
    /// [`lock_many`](Redlock::lock_many), the patience of
    /// [`try_lock`](Redlock::try_lock).
    ///
    /// # Errors
    /// As [`lock_many`](Redlock::lock_many), without the retries.
    ///
    /// # Cancel safety
    /// As [`lock_many`](Redlock::lock_many).
    pub async fn try_lock_many(&self, resources: &[&str], ttl: Duration) -> Result<Lock, Error> {
        self.lock_patiently(resources, ttl, Patience::Retries(0))
            .await
    }

    /// Acquires every resource of `resources`, waiting at most about `wait`
    /// for other holders: the set of [`lock_many`](Redlock::lock_many), the
    /// patience of [`lock_within`](Redlock::lock_within).
    ///
    /// # Errors
    /// As [`lock_many`](Redlock::lock_many).
    ///
    /// # Cancel safety
    /// As [`lock_many`](Redlock::lock_many).
    pub async fn lock_many_within(
        &self,
        resources: &[&str],
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let patience = Patience::Until(timing::after(Instant::now(), wait));
        self.lock_patiently(resources, ttl, patience).await
    }

    /// Acquires every resource of `resources` (as
    /// [`lock_many`](Redlock::lock_many)) with a guard that renews them all
    /// in the background, as [`acquire`](Redlock::acquire) does for one.
    /// The guard's lock is lost as a whole: one renewal extends every key,
    /// and fails where any of them is not ours.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn move_stock() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let guard = redlock
    ///     .acquire_many(&["warehouse:north", "warehouse:south"], Duration::from_secs(10))
    ///     .await?;
    /// tokio::select! {
    ///     () = move_stock() => {}
    ///     reason = guard.lost() => eprintln!("lost: {reason}"),
    /// }
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock_many`](Redlock::lock_many) and as
    /// [`acquire`](Redlock::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn acquire_many(
        &self,
        resources: &[&str],
        ttl: Duration,
    ) -> Result<LockGuard, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.acquire_many_patiently(resources, ttl, patience).await
    }

    /// [`acquire_many`](Redlock::acquire_many) with one attempt.
    ///
    /// # Errors
    /// As [`acquire_many`](Redlock::acquire_many), without the retries.
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn try_acquire_many(
        &self,
        resources: &[&str],
        ttl: Duration,
    ) -> Result<LockGuard, Error> {
        self.acquire_many_patiently(resources, ttl, Patience::Retries(0))
            .await
    }

    async fn acquire_many_patiently(
        &self,
        resources: &[&str],
        ttl: Duration,
        patience: Patience,
    ) -> Result<LockGuard, Error> {
        let interval = self.renew_interval(ttl)?;
        let lock = self.lock_patiently(resources, ttl, patience).await?;
        Ok(self.guard(lock, ttl, interval))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_anything_is_sent() {
        assert!(matches!(check_resources(&[]), Err(Error::NoResources)));
        assert!(matches!(check_resources(&[""]), Err(Error::EmptyResource)));
        assert!(matches!(
            check_resources(&["a", ""]),
            Err(Error::EmptyResource)
        ));
        assert!(matches!(
            check_resources(&["a", "b", "a"]),
            Err(Error::DuplicateResource { resource }) if resource == "a"
        ));
        assert!(check_resources(&["a"]).is_ok());
        assert!(check_resources(&["a", "b"]).is_ok());
        let names: Vec<String> = (0..=MAX_RESOURCES).map(|i| i.to_string()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(check_resources(&names[..MAX_RESOURCES]).is_ok());
        assert!(matches!(
            check_resources(&names),
            Err(Error::TooManyResources { count, max: MAX_RESOURCES }) if count == MAX_RESOURCES + 1
        ));
    }

    #[test]
    fn labels() {
        assert_eq!(label(&["a"]), "a");
        assert_eq!(label(&["a", "b"]), "a, b");
        assert_eq!(label(&["a", "b", "c", "d"]), "a, b, c, d");
        assert_eq!(
            label(&["a", "b", "c", "d", "e", "f"]),
            "a, b, c, d and 2 more"
        );
    }

    #[test]
    fn the_acquire_reply_is_read_strictly() {
        let off = Generation {
            marker: crate::protocol::generation::marker_key(""),
            candidate: "c".into(),
            guard: None,
        };
        let read = read_acquire(&off, "mine", true);
        assert_eq!(read(&Value::Int(1)), Ok(Reply::Agreed(None)));
        assert_eq!(
            read(&Value::BulkString(b"theirs".to_vec())),
            Ok(Reply::Refused {
                holder: Some(b"theirs".to_vec())
            })
        );
        assert!(read(&Value::Nil).is_err());
        assert!(read(&Value::Int(0)).is_err());
        assert!(read(&Value::BulkString(b"mine".to_vec())).is_err());
        let read = read_acquire(&off, "mine", false);
        assert_eq!(read(&Value::Nil), Ok(Reply::Agreed(None)));
        assert!(read(&Value::Int(1)).is_err());
        // Under the guard the reply carries the marker's age.
        let on = Generation {
            guard: Some(std::time::Duration::from_secs(1)),
            ..off.clone()
        };
        let read = read_acquire(&on, "mine", false);
        let marked = |body: Value, age: i64| Value::Array(vec![body, Value::Int(age)]);
        assert_eq!(read(&marked(Value::Nil, 5_000)), Ok(Reply::Agreed(None)));
        assert!(matches!(
            read(&marked(Value::Nil, 5)),
            Ok(Reply::Young { healed: false, .. })
        ));
        assert!(read(&Value::Nil).is_err());
    }
}
