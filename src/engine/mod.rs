//! The engine.

pub(crate) mod acquire;
pub(crate) mod counters;
pub(crate) mod fence;
pub(crate) mod health;
pub(crate) mod lock;
pub(crate) mod node;
pub(crate) mod release;
pub(crate) mod round;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod wait;
pub(crate) mod watchdog;
