//! A test's own certificate authorities and certificates, written as PEM
//! files into a temp dir, for the TLS tests.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub(crate) struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
pub(crate) struct Issued {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl Issued {
    /// The certificate and key's PEM, as a TLS identity takes them.
    pub(crate) fn pem(&self) -> (String, String) {
        let read = |path: &Path| std::fs::read_to_string(path).expect("written");
        (read(&self.cert), read(&self.key))
    }
}

/// What a certificate is for.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Server,
    Client,
}

impl Ca {
    /// A new CA called `name`.
    pub(crate) fn new(name: &str) -> Ca {
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
    pub(crate) fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).expect("a writable temp dir");
        path
    }

    /// The CA's certificate, PEM.
    pub(crate) fn pem(&self) -> &str {
        &self.pem
    }

    /// A certificate for `names` (DNS names or IP addresses) and `role`,
    /// written to `dir/<file>.pem` and `dir/<file>.key`.
    pub(crate) fn issue(&self, dir: &Path, file: &str, names: &[&str], role: Role) -> Issued {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("valid names");
        params.distinguished_name.push(DnType::CommonName, file);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![match role {
            Role::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Role::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        let issued = Issued {
            cert: dir.join(format!("{file}.pem")),
            key: dir.join(format!("{file}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("a writable temp dir");
        std::fs::write(&issued.key, key.serialize_pem()).expect("a writable temp dir");
        issued
    }
}
