//! Optional TLS of the coordination service (rustls with ring, through tonic).
//!
//! The hosting process serves with a certificate and its key; every client verifies the
//! service against a CA certificate, so a job on a shared network neither sends its token in
//! clear nor talks to an impostor. Clients still authenticate with the job token (checked on
//! every RPC): TLS keeps the token secret, the token keeps the job closed.
//!
//! Every PEM file is read and parsed when the options are built, so a missing or malformed file
//! is an error naming it before any connection is made. A client that cannot verify the
//! service (wrong CA, a certificate for another name, a service without TLS) fails at once
//! with [`CoordError::Unauthenticated`] instead of retrying until the connect timeout.

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{CoordError, Result};

/// The most bytes a PEM file may have (a chain of a few certificates is a few KiB).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// A PEM file's bytes, when it is a regular file of at most [`MAX_PEM_BYTES`]: checked before
/// it is opened, as a FIFO would block the read forever and a device never ends.
fn read_pem(path: &Path) -> std::result::Result<Vec<u8>, String> {
    let metadata = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".into());
    }
    if metadata.len() > MAX_PEM_BYTES {
        return Err(format!("{} bytes, more than the {MAX_PEM_BYTES} a PEM file may have", metadata.len()));
    }
    std::fs::read(path).map_err(|e| e.to_string())
}

/// TLS material of a job. Every process holds the CA; the process that hosts the service also
/// holds the certificate and key it serves with (with the same flags on every host, all do).
#[derive(Clone)]
pub struct TlsOptions {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsOptions {
    // Never prints key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("has_identity", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsOptions {
    /// From PEM bytes: the CA certificate(s) clients trust, and optionally the service's
    /// certificate chain and private key. Each is parsed now.
    pub fn from_pem(ca_pem: Vec<u8>, identity: Option<(Vec<u8>, Vec<u8>)>) -> Result<TlsOptions> {
        check_certificates(&ca_pem, "the CA")?;
        if let Some((cert, key)) = &identity {
            check_certificates(cert, "the certificate")?;
            PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| CoordError::InvalidArgument(format!("the key holds no usable private key: {e}")))?;
        }
        Ok(TlsOptions { ca_pem, identity, server_name: None })
    }

    /// From files (`--coordinator-ca`, `--coordinator-cert`, `--coordinator-key`); the
    /// certificate and key go together.
    pub fn from_files(ca: &Path, cert: Option<&Path>, key: Option<&Path>) -> Result<TlsOptions> {
        let read = |path: &Path, what: &str| {
            read_pem(path).map_err(|why| {
                CoordError::InvalidArgument(format!("cannot read the coordinator {what} {}: {why}", path.display()))
            })
        };
        let ca_pem = read(ca, "CA")?;
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((read(cert, "certificate")?, read(key, "key")?)),
            (None, None) => None,
            _ => {
                return Err(CoordError::InvalidArgument(
                    "the coordinator certificate and key go together: give both or neither".into(),
                ));
            }
        };
        TlsOptions::from_pem(ca_pem, identity).map_err(|e| match e {
            CoordError::InvalidArgument(why) => CoordError::InvalidArgument(format!(
                "coordinator TLS ({}{}): {why}",
                ca.display(),
                cert.map(|c| format!(", {}", c.display())).unwrap_or_default()
            )),
            other => other,
        })
    }

    /// The name the service's certificate must hold (default: the host of the coordinator
    /// address, a DNS name or an IP address).
    pub fn with_server_name(mut self, name: Option<String>) -> TlsOptions {
        self.server_name = name;
        self
    }

    /// Whether this process can serve (it has a certificate and key).
    pub fn can_serve(&self) -> bool {
        self.identity.is_some()
    }

    /// The service's TLS configuration (this process's certificate and key).
    pub fn server_config(&self) -> Result<tonic::transport::ServerTlsConfig> {
        let (cert, key) = self.identity.as_ref().ok_or_else(|| {
            CoordError::InvalidArgument(
                "this process hosts the coordinator with TLS but has no certificate and key \
                 (--coordinator-cert, --coordinator-key)"
                    .into(),
            )
        })?;
        Ok(tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(cert, key)))
    }

    pub(crate) fn client_config(&self) -> tonic::transport::ClientTlsConfig {
        let config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem));
        match &self.server_name {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        }
    }
}

fn check_certificates(pem: &[u8], what: &str) -> Result<()> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| CoordError::InvalidArgument(format!("{what} is not a PEM certificate: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(CoordError::InvalidArgument(format!("{what} holds no PEM certificate")));
    }
    Ok(())
}

/// The TLS error in a connection error's source chain, if the connection failed in TLS (a
/// certificate refused, or a peer that does not speak TLS): such a failure does not go away
/// by retrying.
pub(crate) fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // io::Error's source() skips the error it wraps; look inside.
        if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref())
            && let Some(tls) = inner.downcast_ref::<rustls::Error>()
        {
            return Some(tls.to_string());
        }
        current = e.source();
    }
    None
}
