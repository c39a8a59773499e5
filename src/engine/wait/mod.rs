//! Event-driven waiting: a refused acquisition sleeps until the holder's
//! release is published, the holder's keys expire, or its own patience runs
//! out, whichever comes first, instead of polling.
//!
//! The protocol (release channels, subscribe then try, one wake-up per
//! release per manager, the successor named across managers, the
//! releaser's hand-off check and its bound, fairness, the fallback) is
//! described once, in `docs/waiting.md` at the top of the repository. Here
//! is where each part of it is implemented:
//!
//! - the release's publish and the pick of a successor: the unlock
//!   scripts' Lua ([`UNLOCK`](crate::protocol::scripts::UNLOCK) and its helper `RELEASED`), over
//!   the names of [`keys`](crate::protocol::keys) (release channel, own
//!   channel, waiting hash, hand-off marker);
//! - the holder's remaining ttl: the waiting attempt's `SET` + `PTTL`
//!   ([`acquire::waiting_request`](crate::protocol::request::acquire::waiting_request))
//!   and [`holder_expiry`](crate::protocol::timing::holder_expiry);
//! - the waiters of a manager, one queue per release channel, and who a
//!   release message wakes: [`registry`] ([`Waits`](registry::Waits)) and
//!   [`state`] (the shared state, `deliver`);
//! - one waiter's place, its sleep, and a wake-up passed on:
//!   [`registration`] ([`Registration`](registration::Registration));
//! - one subscription connection per node per manager, its bounds, and the
//!   manager's registrations with their [`LEASE`](crate::protocol::timing::LEASE):
//!   [`link`], and what it sends on the node's ordinary connection,
//!   [`side`] (the requests in
//!   [`request::register`](crate::protocol::request::register));
//! - the release's gate, the keys' waiting flags: set by [`side`] before a
//!   link confirms its subscriptions, renewed with the registrations, and
//!   deleted and set again by the unlock script.
//! - the releaser's hand-off check: [`handoff`] ([`check_handoff`](handoff::check_handoff)).

pub(crate) mod handoff;
mod link;
pub(crate) mod registration;
pub(crate) mod registry;
mod side;
mod start;
mod state;
mod subscriber;
