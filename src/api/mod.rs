//! The face: [`Redlock`](crate::Redlock) and every public method in one
//! `impl` block ([`redlock`]), its builder and defaults ([`builder`]), the
//! guard and its watch ([`guard`]), the counters' snapshot ([`stats`]), and
//! the parsing of node addresses ([`address`]), and what a call locks
//! ([`resources`]: one name or several). Each method is a thin call
//! into the engine ([`crate::engine`]).

pub(crate) mod address;
pub(crate) mod builder;
pub(crate) mod guard;
pub(crate) mod redlock;
pub(crate) mod resources;
pub(crate) mod stats;
