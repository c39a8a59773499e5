//! The protocol.

pub(crate) mod error;
pub(crate) mod generation;
pub(crate) mod request;
pub(crate) mod scripts;
pub(crate) mod tally;
pub(crate) mod timing;
