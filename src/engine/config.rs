//! The settings of a manager, as the builder
//! ([`RedlockBuilder`](crate::RedlockBuilder)) produces them; the engine
//! reads them here and never imports the builder.

use std::time::Duration;

use crate::protocol::durability::Durability;

/// The settings of a manager; see the builder's setters for each.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) retry_count: u32,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) key_prefix: String,
    pub(crate) renew_interval: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) renew_concurrency: usize,
    pub(crate) restart_guard: Option<Duration>,
    pub(crate) durability: Durability,
    pub(crate) stats: bool,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::engine::tls::TlsConfig>,
}
