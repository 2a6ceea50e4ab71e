//! TLS on the listeners (rustls with ring): `tls_cert` (a PEM certificate chain) and
//! `tls_key` (a PEM private key) read once at start, so a bad file stops the server before
//! it listens; the HTTP and metrics ports take the acceptor, the gRPC port the PEM bytes.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

/// The server's certificate and key, ready for each kind of listener.
#[derive(Clone)]
pub struct Tls {
    /// HTTP/1.1 over TLS (the HTTP and metrics ports).
    pub acceptor: TlsAcceptor,
    /// The certificate file's bytes (tonic builds its own acceptor for the gRPC port).
    pub cert_pem: Vec<u8>,
    /// The key file's bytes.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls { .. }")
    }
}

impl Tls {
    /// Reads and checks the certificate chain at `cert` and the private key at `key`.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls> {
        let read = |p: &Path, what: &str| {
            std::fs::read(p).map_err(|e| {
                Error::Config(format!("cannot read the TLS {what} {}: {e}", p.display()))
            })
        };
        let (cert_pem, key_pem) = (read(cert, "certificate")?, read(key, "key")?);
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| {
                Error::Config(format!(
                    "{}: not a PEM certificate chain: {e}",
                    cert.display()
                ))
            })?;
        if chain.is_empty() {
            return Err(Error::Config(format!(
                "{}: no certificate in it",
                cert.display()
            )));
        }
        let private = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| Error::Config(format!("{}: not a PEM private key: {e}", key.display())))?;
        // ring, as tonic's TLS uses: aws-lc-rs (rustls' post-quantum default) needs cmake
        // to build, which a fresh machine may lack.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private))
            .map_err(|e| Error::Config(format!("TLS certificate and key: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            cert_pem,
            key_pem,
        })
    }
}
