//! TLS for the report channel. The controller serves its report endpoint with a
//! certificate and key from files (a Kubernetes TLS Secret, as cert-manager writes one)
//! and takes a rotated pair without a restart; the agent checks the controller's
//! certificate against a CA file (or the system's roots). A report that decides anything
//! by its content must come over this channel: a bearer token read off a plain HTTP
//! connection would let its holder speak for the node.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How often the certificate files are looked at for a rotation.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Why a certificate, key or CA file cannot be used; each names its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read it: {message}")]
    Read { path: String, message: String },
    #[error("{path}: {message}")]
    Content { path: String, message: String },
    #[error("{cert} and {key}: {message}")]
    Mismatch {
        cert: String,
        key: String,
        message: String,
    },
}

/// The one crypto provider, the one kube's client uses too.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.display().to_string(),
        message: error.to_string(),
    })
}

/// Every certificate of a PEM file, in order; an error when it holds none.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let content = |message: String| TlsError::Content {
        path: path.display().to_string(),
        message,
    };
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| content(format!("not a PEM certificate file: {error}")))?;
    if certificates.is_empty() {
        return Err(content(
            "holds no certificate (a \"-----BEGIN CERTIFICATE-----\" block)".to_string(),
        ));
    }
    Ok(certificates)
}

/// A certificate chain with its private key, checked to belong together.
fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert)?;
    let key_pem = read(key)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| TlsError::Content {
        path: key.display().to_string(),
        message: format!("holds no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {error}"),
    })?;
    let certified = CertifiedKey::from_der(chain, private, &provider()).map_err(|error| {
        TlsError::Mismatch {
            cert: cert.display().to_string(),
            key: key.display().to_string(),
            message: format!("the key does not belong to the certificate, or is of a kind TLS cannot use: {error}"),
        }
    })?;
    Ok(certified)
}

/// When a file last changed, and its size.
pub type FileStamp = (SystemTime, u64);

/// A file's [`FileStamp`], following symlinks (a Secret volume swaps a symlink): what the
/// controller's certificate and the agent's CA are reloaded on.
pub fn file_stamp(path: &Path) -> Option<FileStamp> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// The controller's certificate, replaced in place when its files change.
#[derive(Debug)]
pub struct ServerIdentity {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamps: [Option<FileStamp>; 2],
}

impl ServerIdentity {
    /// Loads the pair; an error names the file that is wrong.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerIdentity>, TlsError> {
        let stamps = [file_stamp(cert_file), file_stamp(key_file)];
        let key = Arc::new(certified_key(cert_file, key_file)?);
        Ok(Arc::new(ServerIdentity {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            current: RwLock::new(Loaded { key, stamps }),
        }))
    }

    /// Loads the pair again if either file changed. `Ok(true)`: a new certificate is
    /// served from the next handshake on. On an error the previous pair stays in use.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let stamps = [file_stamp(&self.cert_file), file_stamp(&self.key_file)];
        if self.read().stamps == stamps {
            return Ok(false);
        }
        let loaded = certified_key(&self.cert_file, &self.key_file);
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        // Remember the stamps either way: a broken pair is reported once, not every tick.
        current.stamps = stamps;
        current.key = Arc::new(loaded?);
        Ok(true)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.current.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The server configuration: TLS 1.2 and 1.3, HTTP/1.1, this identity.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Content {
                path: self.cert_file.display().to_string(),
                message: error.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // An agent keeps one connection open and never resumes a session: no tickets,
        // and no session cache holding state for 5,000 of them.
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(config)
    }
}

impl ResolvesServerCert for ServerIdentity {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.read().key.clone())
    }
}

/// Looks at the certificate files every [`RELOAD_EVERY`] until `stop` resolves.
pub async fn watch_identity(
    identity: Arc<ServerIdentity>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    let mut ticker = tokio::time::interval(RELOAD_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut stop => return,
        }
        let probe = identity.clone();
        match tokio::task::spawn_blocking(move || probe.reload_if_changed()).await {
            Ok(Ok(true)) => tracing::info!(
                cert = %identity.cert_file.display(),
                "the report endpoint's certificate changed; new connections get the new one"
            ),
            Ok(Ok(false)) | Err(_) => {}
            Ok(Err(error)) => tracing::error!(
                %error,
                "the report endpoint's new certificate cannot be used; the previous one stays in use"
            ),
        }
    }
}

/// The agent's client configuration: the controller's certificate is checked against
/// `ca_file`, or against the system's roots when there is none.
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for certificate in certificates(path)? {
                roots.add(certificate).map_err(|error| TlsError::Content {
                    path: path.display().to_string(),
                    message: format!("not a usable CA certificate: {error}"),
                })?;
            }
        }
        None => {
            roots.add_parsable_certificates(system_roots());
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Content {
            path: ca_file.map(|p| p.display().to_string()).unwrap_or_default(),
            message: error.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The system's trusted roots (`/etc/ssl/certs` and the like).
fn system_roots() -> Vec<CertificateDer<'static>> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!(%error, "a system CA certificate cannot be read");
    }
    found.certs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named() {
        let error = ServerIdentity::load(Path::new("/nonexistent/tls.crt"), Path::new("/k"))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("/nonexistent/tls.crt: cannot read it"),
            "{error}"
        );
    }

    #[test]
    fn a_file_without_a_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        std::fs::write(&cert, "not a certificate\n").unwrap();
        let error = ServerIdentity::load(&cert, &dir.path().join("tls.key"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("tls.crt: holds no certificate"), "{error}");
        let error = client_config(Some(&cert)).unwrap_err().to_string();
        assert!(error.contains("tls.crt: holds no certificate"), "{error}");
    }
}
