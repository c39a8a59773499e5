//! Event-driven waiting: a refused acquisition sleeps until the holder's
//! release is published, the holder's keys expire, or its own patience runs
//! out, whichever comes first, instead of polling.
//!
//! # The pieces
//! - **A release notifies.** The unlock scripts publish, in the same script
//!   as the delete, on the key's release channel
//!   ([`keys::release_channel`](crate::protocol::keys::release_channel)). No extra round trip.
//! - **A refusal tells how long.** An attempt of a waiter (every one after
//!   the first refusal, which is a bare `SET`) sends `PTTL key` right
//!   behind its `SET … NX PX … GET` in one pipeline (one round trip); [`Pttls`](crate::protocol::request::acquire::Pttls) keeps what the refusing nodes said, and
//!   [`holder_expiry`](crate::protocol::timing::holder_expiry) turns it into the instant a quorum of them will be free.
//! - **Subscribe, then try.** The first refusal registers the waiter
//!   ([`Waits::register`]), which subscribes the key's channel on every node
//!   and waits for the confirmations of a quorum of nodes (or of every node
//!   that is not down); only then is the next attempt sent, so a release
//!   between the refusal and the subscription is never slept through (it
//!   deleted the key on a quorum, and two quorums share a node). A node
//!   that hangs does not hold the waiter up.
//! - **One subscription connection per node per manager**, shared by all
//!   its waiters: a task per node ([`link`]) owns it, subscribes a
//!   channel when its first waiter comes and unsubscribes it when the last
//!   one leaves. Every call it makes on its node is bounded
//!   (`CALL_SLICE` in [`link`]: past it, the connection counts as broken and is
//!   made again), and what it still has to do is bounded too: the channels
//!   that changed, as a set of at most `MAX_DIRTY` (past that, it
//!   compares every channel), and at most `SIDE_QUEUE` batches of
//!   registrations, dropped with the session.
//! - **One wake-up per release per manager.** A release is published on
//!   every node that deleted the key, with the same message (a hash of the
//!   token); each channel remembers the last messages and counts a release
//!   once. It wakes the first waiter of the key that is not already woken,
//!   in registration order; the copies from the other nodes go to the same
//!   waiter (its attempt may have overtaken the release on those nodes and
//!   found the old holder there: it tries again). A wake-up its waiter
//!   cannot use goes on to the next waiter of the key, with the copies
//!   still to come: a waiter that leaves without the lock after it was
//!   woken (cancelled, out of patience), and a waiter for a set of keys
//!   whose attempt found a holder (it may be another key's). A waiter for
//!   one key that finds a holder keeps it: the key is held again (that
//!   holder's release wakes the next) or the release has not reached every
//!   node yet (its copies wake the same waiter again).
//! - **One manager woken per release, across managers.** Each manager
//!   also subscribes its own channel for each key it waits for
//!   ([`keys::successor_channel`](crate::protocol::keys::successor_channel): the key's channel, `0xFF`, its id),
//!   and then registers in the key's waiting hash on that node
//!   ([`keys::waiters_key`](crate::protocol::keys::waiters_key), [`REGISTER`](crate::protocol::scripts::REGISTER)), with a lease
//!   ([`LEASE`](crate::protocol::timing::LEASE)) it renews every third of it; it removes the registration
//!   before it unsubscribes. A release picks one registered manager, the
//!   successor, and publishes on that manager's channel only: the other
//!   managers receive nothing. A release whose successor has no subscriber
//!   there (it died, its connection broke, or it already took the lock on
//!   the nodes that were quicker and left) drops that registration and
//!   tries the next (at most 3), then publishes on the key's channel, for
//!   everyone; so does one whose own-channel `PUBLISH` is denied. A
//!   manager named when no waiter of the key is left passes the release
//!   on: its link publishes it again on the key's channel. A node that
//!   denies the own channels (an ACL that allows the keys' channels only)
//!   gets no registration: its releases wake every manager, as without
//!   this.
//! - **The releaser checks the hand-off.** A subscriber is not a taker:
//!   `PUBLISH` counts the connection of a manager whose process is stopped
//!   (SIGSTOP, a debugger, a VM paused), and a live manager's waiters may
//!   all be unable to use the release. So an unlock script that named a
//!   successor says so (it returns 2), and the releaser, [`HANDOFF_CHECK`](crate::protocol::timing::HANDOFF_CHECK)
//!   (200 ms) later, asks each node that released: where the key is still
//!   free and no later release of it came, the release is published again
//!   on the key's channel, for every manager ([`check_handoff`]). A named
//!   manager that does not take the lock delays the others by about that
//!   much, per release that names it (a stopped one stays registered for at
//!   most its [`LEASE`](crate::protocol::timing::LEASE)). Only releases that named a successor pay for it:
//!   one script per node, off the caller's path.
//! - **Degrading.** A node whose subscription is denied (ACL), down, or
//!   broken counts as unsubscribed. A waiter sleeps on notifications alone
//!   only while a quorum of nodes confirmed its subscription: a release that
//!   succeeded deleted the key on a quorum, and two quorums share a node, so
//!   one of its messages reaches us. Otherwise it also sleeps at most the
//!   timed retry pause (`retry_delay` + `retry_jitter`). Whenever a node's
//!   subscription breaks or is made again after a break, every waiter of
//!   the manager tries once more (a release may have been missed in
//!   between).
//! - **Foreign releases.** A client that deletes without publishing (another
//!   Redlock library) is caught at the key's expiry and by the first waiter
//!   of each key in each manager, which keeps the timed retry as a safety
//!   net. The other waiters of that key sleep until a notification (which
//!   that first waiter's own release, once it holds the lock, provides).
//!
//! # Fairness
//! Within one manager, waiters of a key are woken in the order they
//! registered (first refusal first), one per release. Across managers
//! (processes), each release names one registered manager, picked
//! uniformly by the token's hash. A first attempt (not yet waiting) can
//! still take a free lock before the named waiter's round. FIFO across
//! processes would need one queue that every client agrees on; with
//! independent nodes that is a consensus problem (the nodes may order two
//! enqueues differently, and a majority vote on a queue position is
//! another Redlock round per position), so it is not offered.

mod handoff;
mod link;
mod registration;
mod registry;

pub(crate) use handoff::check_handoff;
pub(crate) use registry::{Registration, Waits};
