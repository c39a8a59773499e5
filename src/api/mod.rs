//! The face.

pub(crate) mod address;
pub(crate) mod builder;
pub(crate) mod guard;
