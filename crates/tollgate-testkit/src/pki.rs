//! A test's own certificate authorities and certificates, as PEM text or
//! written as PEM files into a test's temp dir.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
pub struct Issued {
    /// The certificate's file.
    pub cert: PathBuf,
    /// The key's file.
    pub key: PathBuf,
}

impl Issued {
    /// The certificate and key's PEM, as a TLS identity takes them.
    pub fn pem(&self) -> (String, String) {
        let read = |path: &Path| std::fs::read_to_string(path).expect("written");
        (read(&self.cert), read(&self.key))
    }
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    /// A server's certificate.
    Server,
    /// A client's certificate.
    Client,
    /// Both: a Redis Cluster node serves its clients and is the client of
    /// its peers' cluster bus.
    Peer,
}

impl Ca {
    /// A new CA called `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a key");
        let cert = params.self_signed(&key).expect("self-signed");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA's certificate to `dir/file`.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).expect("a writable temp dir");
        path
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A certificate for `names` (DNS names or IP addresses) and `role`,
    /// called `common_name`: its PEM and its key's PEM.
    pub fn issue_pem(&self, common_name: &str, names: &[&str], role: Role) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("valid names");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match role {
            Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Role::Peer => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }

    /// [`Ca::issue_pem`], written to `dir/<file>.pem` and `dir/<file>.key`.
    pub fn issue(&self, dir: &Path, file: &str, names: &[&str], role: Role) -> Issued {
        let (cert, key) = self.issue_pem(file, names, role);
        let issued = Issued {
            cert: dir.join(format!("{file}.pem")),
            key: dir.join(format!("{file}.key")),
        };
        std::fs::write(&issued.cert, cert).expect("a writable temp dir");
        std::fs::write(&issued.key, key).expect("a writable temp dir");
        issued
    }
}
