//! The protocol: pure rules and wire formats, no tokio and no sockets.
//! Everything here is unit-tested where it stands.
//!
//! - [`quorum`]: the quorum rule and its vocabulary (what a round asks, how
//!   a node answered, how a round ended, when a fencing read is proven);
//! - [`tally`]: counting one round's answers, and what a failed round means;
//! - [`timing`]: every time rule;
//! - [`keys`]: every key and channel name, the one separator, and the
//!   resource names;
//! - [`request`]: one module per operation, what is sent and how its reply
//!   is read;
//! - [`scripts`]: the Lua text;
//! - [`generation`]: the generation markers and the restart guard's rule;
//! - [`durability`]: the durability setting and its confirmation command;
//! - [`server_info`]: what a server's `INFO` says (family, version, id);
//! - [`error`]: the errors every layer names, and [`error_kind`] their
//!   kinds; [`loss`]: why a guarded lock is no longer held.

pub(crate) mod durability;
pub(crate) mod error;
pub(crate) mod error_kind;
pub(crate) mod generation;
pub(crate) mod keys;
pub(crate) mod loss;
pub(crate) mod quorum;
pub(crate) mod request;
pub(crate) mod scripts;
pub(crate) mod server_info;
pub(crate) mod tally;
pub(crate) mod timing;
