//! TLS where envoyproxy/ratelimit speaks it over gRPC: its gRPC listener
//! (`GRPC_SERVER_USE_TLS`, or `--grpc-tls-cert`) and its xDS client
//! (`CONFIG_GRPC_XDS_SERVER_USE_TLS`), configured as its `settings.go` and
//! `utils.TlsConfigFromFiles` configure them. Every file is read once, at
//! start-up; one that cannot be read or holds no usable PEM stops the start
//! with an error naming its setting and path.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::SettingsError;

/// The gRPC listener's TLS flags (each also from its `TOLLGATE_*`
/// variable); in envoyproxy/ratelimit's mode its `GRPC_SERVER_*` variables
/// fill those not given.
#[derive(Debug, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args), group(id = "grpc_tls"))]
pub struct GrpcTlsFlags {
    /// Serve gRPC over TLS (ALPN `h2`) with this certificate chain (PEM),
    /// read at start-up; needs `--grpc-tls-key`.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_GRPC_TLS_CERT", value_name = "PATH")
    )]
    pub grpc_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of `--grpc-tls-cert`.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_GRPC_TLS_KEY", value_name = "PATH")
    )]
    pub grpc_tls_key: Option<PathBuf>,

    /// Require a client certificate on gRPC, verified against the CA
    /// certificates of this file (PEM): mutual TLS.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_GRPC_CLIENT_CA", value_name = "PATH")
    )]
    pub grpc_client_ca: Option<PathBuf>,

    /// With `--grpc-client-ca`: the client certificate must also be valid
    /// for this name (a DNS name, wildcards matched, or an IP address).
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_GRPC_CLIENT_SAN", value_name = "NAME")
    )]
    pub grpc_client_san: Option<String>,
}

/// The Redis TLS flags (`--redis-tls-*`); in envoyproxy/ratelimit's mode its
/// `REDIS_TLS_*` variables fill those not given.
#[derive(Debug, Default, Clone)]
pub struct RedisTlsFlags {
    /// `--redis-tls-ca`.
    pub ca: Option<PathBuf>,
    /// `--redis-tls-cert`.
    pub cert: Option<PathBuf>,
    /// `--redis-tls-key`.
    pub key: Option<PathBuf>,
    /// `--redis-tls-skip-hostname-verification`.
    pub skip_hostname_verification: bool,
}

/// A file a setting names: the setting (flag or variable), for errors.
#[derive(Debug, Clone)]
pub struct Named {
    /// The flag or variable that names the file.
    pub setting: &'static str,
    /// The file.
    pub path: PathBuf,
}

impl Named {
    /// The file `path`, named by `setting`.
    pub fn new(setting: &'static str, path: impl Into<PathBuf>) -> Self {
        Self {
            setting,
            path: path.into(),
        }
    }

    fn read(&self) -> anyhow::Result<Vec<u8>> {
        std::fs::read(&self.path)
            .with_context(|| format!("{}: cannot read {}", self.setting, self.path.display()))
    }

    /// The certificates of the file, at least one.
    fn certificates(&self) -> anyhow::Result<Vec<CertificateDer<'static>>> {
        let pem = self.read()?;
        let certificates = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| self.bad("not PEM certificates"))?;
        if certificates.is_empty() {
            bail!(self.bad("no PEM certificate in it"));
        }
        Ok(certificates)
    }

    fn private_key(&self) -> anyhow::Result<PrivateKeyDer<'static>> {
        let pem = self.read()?;
        PrivateKeyDer::from_pem_slice(&pem).with_context(|| self.bad("no PEM private key in it"))
    }

    fn bad(&self, why: &str) -> String {
        format!("{}: {}: {why}", self.setting, self.path.display())
    }
}

/// The TLS files of a `rediss` Redis URL, each named by its setting.
#[derive(Debug, Clone, Default)]
pub struct RedisFiles {
    /// The CA that Redis's certificate must chain to.
    pub ca: Option<Named>,
    /// The client certificate, for mutual TLS.
    pub cert: Option<Named>,
    /// The client certificate's key.
    pub key: Option<Named>,
    /// Whether Redis's certificate may be for another name.
    pub skip_hostname_verification: bool,
}

impl RedisFiles {
    /// The files `--redis-tls-*` name.
    pub fn from_flags(flags: &RedisTlsFlags) -> Self {
        let named = |setting, path: &Option<PathBuf>| path.as_ref().map(|p| Named::new(setting, p));
        Self {
            ca: named("--redis-tls-ca", &flags.ca),
            cert: named("--redis-tls-cert", &flags.cert),
            key: named("--redis-tls-key", &flags.key),
            skip_hostname_verification: flags.skip_hostname_verification,
        }
    }

    /// The store's TLS settings, the files read and checked now.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or holds no usable PEM (naming its
    /// setting), or a certificate without its key or a key without its
    /// certificate.
    pub fn read(&self) -> Result<tollgate_redis::RedisTls, SettingsError> {
        self.read_files().map_err(SettingsError)
    }

    fn read_files(&self) -> anyhow::Result<tollgate_redis::RedisTls> {
        let ca = match &self.ca {
            Some(ca) => {
                ca.certificates()?;
                Some(ca.read()?)
            }
            None => None,
        };
        let client_identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                cert.certificates()?;
                key.private_key()?;
                Some(tollgate_redis::ClientIdentity {
                    cert: cert.read()?,
                    key: key.read()?,
                })
            }
            (None, None) => None,
            (Some(one), None) | (None, Some(one)) => bail!(
                "{}: a client certificate to Redis needs both its certificate and its key",
                one.setting
            ),
        };
        Ok(tollgate_redis::RedisTls {
            ca,
            client_identity,
            skip_hostname_verification: self.skip_hostname_verification,
        })
    }
}

/// What the gRPC listener serves TLS with.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    /// The certificate chain.
    pub cert: Named,
    /// Its private key.
    pub key: Named,
    /// Client certificates required and verified against these CAs.
    pub client_ca: Option<Named>,
    /// The name the client certificate must be valid for, and its setting.
    pub client_san: Option<(&'static str, String)>,
}

impl ServerFiles {
    /// The files `args` name, if any. (In envoyproxy/ratelimit's mode its
    /// variables may complete the flags, so clap does not check them.)
    ///
    /// # Errors
    ///
    /// A flag given without the ones it needs.
    pub fn from_flags(args: &GrpcTlsFlags) -> Result<Option<Self>, SettingsError> {
        Self::from_given(args).map_err(SettingsError)
    }

    fn from_given(args: &GrpcTlsFlags) -> anyhow::Result<Option<Self>> {
        let (cert, key) = match (&args.grpc_tls_cert, &args.grpc_tls_key) {
            (Some(cert), Some(key)) => (cert, key),
            (None, None) if args.grpc_client_ca.is_none() && args.grpc_client_san.is_none() => {
                return Ok(None);
            }
            _ => bail!(
                "--grpc-tls-cert and --grpc-tls-key go together, and the client flags need them"
            ),
        };
        if args.grpc_client_san.is_some() && args.grpc_client_ca.is_none() {
            bail!("--grpc-client-san needs --grpc-client-ca");
        }
        Ok(Some(Self {
            cert: Named::new("--grpc-tls-cert", cert),
            key: Named::new("--grpc-tls-key", key),
            client_ca: args
                .grpc_client_ca
                .as_ref()
                .map(|ca| Named::new("--grpc-client-ca", ca)),
            client_san: args
                .grpc_client_san
                .clone()
                .map(|san| ("--grpc-client-san", san)),
        }))
    }

    /// The listener's TLS config, its files read now.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or holds no usable PEM, a key that is not
    /// the certificate's, a SAN that is no name.
    pub fn config(&self) -> Result<rustls::ServerConfig, SettingsError> {
        self.server_config().map_err(SettingsError)
    }

    fn server_config(&self) -> anyhow::Result<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .context("TLS versions")?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for certificate in ca.certificates()? {
                    roots
                        .add(certificate)
                        .with_context(|| ca.bad("not a CA certificate"))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(&provider),
                )
                .build()
                .with_context(|| ca.bad("cannot verify clients with it"))?;
                match &self.client_san {
                    None => builder.with_client_cert_verifier(verifier),
                    Some((setting, san)) => {
                        let name = ServerName::try_from(san.clone())
                            .with_context(|| format!("{setting}={san:?}: not a DNS name or IP"))?;
                        builder.with_client_cert_verifier(Arc::new(WithSan {
                            inner: verifier,
                            name,
                        }))
                    }
                }
            }
        };
        let certificates = self.cert.certificates()?;
        let key = self.key.private_key()?;
        builder
            .with_single_cert(certificates, key)
            .with_context(|| {
                format!(
                    "{} ({}) and {} ({}): not a certificate and its key",
                    self.cert.setting,
                    self.cert.path.display(),
                    self.key.setting,
                    self.key.path.display()
                )
            })
    }
}

/// A client verifier that also requires the certificate to be valid for
/// `name`, as envoyproxy/ratelimit's `verifyClient` (`src/server/tls.go`)
/// verifies `GRPC_CLIENT_TLS_SAN` as the `DNSName` of Go's `x509.Verify`.
#[derive(Debug)]
struct WithSan {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for WithSan {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, &self.name)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The xDS client's TLS: envoyproxy/ratelimit's
/// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`/`_KEY` (its certificate, for mutual
/// TLS), `CONFIG_GRPC_XDS_SERVER_TLS_CACERT` (trusted besides the system's
/// roots, as Go's `x509.SystemCertPool` plus the file) and
/// `CONFIG_GRPC_XDS_SERVER_TLS_SAN` (the name the server's certificate must
/// be valid for, and the SNI; the URL's host otherwise).
///
/// # Errors
///
/// A file that cannot be read or holds no usable PEM.
pub(crate) fn xds_client(
    identity: Option<(Named, Named)>,
    ca: Option<Named>,
    san: Option<String>,
) -> anyhow::Result<ClientTlsConfig> {
    let mut config = ClientTlsConfig::new().with_native_roots();
    if let Some((cert, key)) = identity {
        // Parsed here only to fail at start-up rather than at each connection.
        cert.certificates()?;
        key.private_key()?;
        config = config.identity(Identity::from_pem(cert.read()?, key.read()?));
    }
    if let Some(ca) = ca {
        ca.certificates()?;
        config = config.ca_certificate(Certificate::from_pem(ca.read()?));
    }
    if let Some(san) = san {
        config = config.domain_name(san);
    }
    Ok(config)
}
