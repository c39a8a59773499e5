//! Tracing, behind the `tracing` feature (on by default): a span for each
//! operation, and events for what an operator needs to see. Without the
//! feature, all of it compiles to nothing.
//!
//! Levels keep the default `info` quiet on the happy path:
//! - `debug`: spans (`lock`, each `attempt` in it with its number, `extend`, `unlock`, `renewal`), a node that did
//!   not agree and why, a retry, a split vote, a renewal that failed and is
//!   retried, releases owed to and retried on an unreachable node;
//! - `warn`: a lock lost (and why), a configuration that weakens the
//!   guarantees (an even number of nodes, a node without AOF persistence);
//! - `error`: one server named twice in the node list.
//!
//! Tokens and passwords are never recorded: nodes appear by their label
//! (address without credentials), locks by their resource name.

use std::future::Future;

/// The span type: `tracing::Span`, or nothing without the feature.
#[cfg(feature = "tracing")]
pub(crate) type Span = tracing::Span;

/// The span type: `tracing::Span`, or nothing without the feature.
#[cfg(not(feature = "tracing"))]
#[derive(Debug, Clone)]
pub(crate) struct Span;

/// A `debug`-level span with fields, or nothing without the feature.
macro_rules! span {
    ($name:literal $(, $($fields:tt)*)?) => {{
        #[cfg(feature = "tracing")]
        let span = tracing::debug_span!($name $(, $($fields)*)?);
        #[cfg(not(feature = "tracing"))]
        let span = $crate::trace::Span;
        span
    }};
}

/// Events at each level; without the feature they expand to nothing (their
/// arguments are not evaluated, so they must not be the only use of a
/// value).
#[cfg(feature = "tracing")]
macro_rules! debug { ($($t:tt)*) => { tracing::debug!($($t)*) } }
#[cfg(not(feature = "tracing"))]
macro_rules! debug {
    ($($t:tt)*) => {{}};
}
#[cfg(feature = "tracing")]
macro_rules! warning { ($($t:tt)*) => { tracing::warn!($($t)*) } }
#[cfg(not(feature = "tracing"))]
macro_rules! warning {
    ($($t:tt)*) => {{}};
}
#[cfg(feature = "tracing")]
macro_rules! error { ($($t:tt)*) => { tracing::error!($($t)*) } }
#[cfg(not(feature = "tracing"))]
macro_rules! error {
    ($($t:tt)*) => {{}};
}

pub(crate) use {debug, error, span, warning};

/// Runs a future inside a span.
pub(crate) trait InSpan: Future + Sized {
    /// The future, entered into `span` each time it is polled.
    fn in_span(self, span: Span) -> impl Future<Output = Self::Output>;
}

impl<F: Future> InSpan for F {
    #[cfg(feature = "tracing")]
    fn in_span(self, span: Span) -> impl Future<Output = Self::Output> {
        tracing::Instrument::instrument(self, span)
    }

    #[cfg(not(feature = "tracing"))]
    fn in_span(self, _span: Span) -> impl Future<Output = Self::Output> {
        self
    }
}
