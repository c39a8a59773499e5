//! TLS to the nodes (feature `tls`): `rediss://` URLs over rustls, with the
//! system's roots, a custom CA, or a client certificate for mutual TLS. No
//! OpenSSL is needed to build.

use std::fmt;

/// The certificates for `rediss://` nodes. Set with
/// [`RedlockBuilder::tls`](crate::RedlockBuilder::tls); without it, a
/// `rediss://` node is verified against the system's roots.
///
/// # Examples
/// ```no_run
/// use redlock_quorum::{Redlock, TlsConfig};
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let tls = TlsConfig::new()
///     .ca_pem(std::fs::read("/etc/redis/ca.crt")?)
///     .client_identity_pem(
///         std::fs::read("/etc/redis/client.crt")?,
///         std::fs::read("/etc/redis/client.key")?,
///     );
/// let redlock = Redlock::builder(["rediss://cache-1:6380/", "rediss://cache-2:6380/", "rediss://cache-3:6380/"])
///     .tls(tls)
///     .build()?;
/// # let _ = redlock;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
#[must_use]
pub struct TlsConfig {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsConfig {
    /// No custom CA and no client certificate: the system's roots.
    pub fn new() -> Self {
        TlsConfig::default()
    }

    /// Trust this CA (PEM) instead of the system's roots.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Present this certificate and private key (both PEM) to nodes that
    /// ask for one (mutual TLS, `tls-auth-clients yes`).
    pub fn client_identity_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some((cert.into(), key.into()));
        self
    }

    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca_pem.clone(),
        }
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("TlsConfig")
            .field("custom_ca", &self.ca_pem.is_some())
            .field("client_identity", &self.client.is_some())
            .finish()
    }
}
