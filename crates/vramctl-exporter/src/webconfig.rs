//! `--web.config.file`: TLS and basic auth in the format of Prometheus' exporter-toolkit
//! (`docs/web-configuration.md` there), so one file serves node_exporter, dcgm-exporter and
//! vramctl alike.
//!
//! Supported: `tls_server_config.{cert_file, key_file, client_auth_type, client_ca_file,
//! min_version, max_version}`, `basic_auth_users`, `http_server_config.headers`. Keys the
//! toolkit knows but vramctl does not implement (`cipher_suites`, `rate_limit`, …) are
//! refused rather than ignored: silently dropping a security setting would be worse than
//! not starting. Relative paths are relative to the config file, as in the toolkit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use super::auth::Authenticator;

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsSection>,
    http_server_config: Option<HttpSection>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    rate_limit: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSection {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
    // Known to the toolkit, not implemented here: refused with a message.
    cert: Option<serde_yaml_ng::Value>,
    key: Option<serde_yaml_ng::Value>,
    client_allowed_sans: Option<serde_yaml_ng::Value>,
    cipher_suites: Option<serde_yaml_ng::Value>,
    curve_preferences: Option<serde_yaml_ng::Value>,
    prefer_server_cipher_suites: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSection {
    #[serde(default)]
    headers: BTreeMap<String, String>,
    http2: Option<serde_yaml_ng::Value>,
}

/// A loaded, checked web config.
#[derive(Clone)]
pub struct WebConfig {
    /// TLS server settings, when `tls_server_config` is given.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Basic auth, when `basic_auth_users` is not empty.
    pub auth: Option<Arc<Authenticator>>,
    /// Extra response headers (`http_server_config.headers`).
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("auth", &self.auth.is_some())
            .field("headers", &self.headers)
            .finish()
    }
}

impl WebConfig {
    /// No TLS, no auth.
    pub fn plain() -> Self {
        Self {
            tls: None,
            auth: None,
            headers: Vec::new(),
        }
    }

    /// Reads and checks `path`: certificates load, hashes are bcrypt.
    ///
    /// # Errors
    /// An unreadable or malformed file, an unsupported setting, a certificate or key that
    /// does not load, a password that is not a bcrypt hash.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the web config '{}'", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base).with_context(|| format!("web config '{}'", path.display()))
    }

    /// [`WebConfig::load`] on text, with relative paths resolved against `base`.
    ///
    /// # Errors
    /// As [`WebConfig::load`].
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Self> {
        // An empty file is a valid "nothing configured", as in the toolkit.
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            serde_yaml_ng::from_str(text)?
        };
        if file.rate_limit.is_some() {
            unsupported("rate_limit")?;
        }
        let mut headers = Vec::new();
        if let Some(http) = file.http_server_config {
            if http.http2.is_some() {
                unsupported("http_server_config.http2")?;
            }
            for (name, value) in http.headers {
                if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err()
                    || hyper::header::HeaderValue::from_str(&value).is_err()
                {
                    bail!("http_server_config.headers: '{name}: {value}' is not a valid header");
                }
                headers.push((name, value));
            }
        }
        let tls = file
            .tls_server_config
            .map(|tls| tls_config(tls, base).map(Arc::new))
            .transpose()?;
        let auth = if file.basic_auth_users.is_empty() {
            None
        } else {
            Some(Arc::new(Authenticator::new(file.basic_auth_users)?))
        };
        Ok(Self { tls, auth, headers })
    }
}

fn unsupported(key: &str) -> anyhow::Result<()> {
    bail!("'{key}' is not supported by vramctl; remove it (see docs/metrics.md#security)")
}

fn tls_config(tls: TlsSection, base: &Path) -> anyhow::Result<rustls::ServerConfig> {
    for (key, value) in [
        ("tls_server_config.cert", &tls.cert),
        ("tls_server_config.key", &tls.key),
        (
            "tls_server_config.client_allowed_sans",
            &tls.client_allowed_sans,
        ),
        ("tls_server_config.cipher_suites", &tls.cipher_suites),
        (
            "tls_server_config.curve_preferences",
            &tls.curve_preferences,
        ),
        (
            "tls_server_config.prefer_server_cipher_suites",
            &tls.prefer_server_cipher_suites,
        ),
    ] {
        if value.is_some() {
            unsupported(key)?;
        }
    }
    let resolve = |p: &Path| -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };
    let (Some(cert_file), Some(key_file)) = (&tls.cert_file, &tls.key_file) else {
        bail!("tls_server_config needs both cert_file and key_file");
    };
    let cert_path = resolve(cert_file);
    let key_path = resolve(key_file);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .and_then(Iterator::collect)
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot read certificates from '{}': {e}",
                cert_path.display()
            )
        })?;
    if certs.is_empty() {
        bail!("no certificate in '{}'", cert_path.display());
    }
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read a private key from '{}': {e}",
            key_path.display()
        )
    })?;

    let versions: Vec<&'static rustls::SupportedProtocolVersion> = {
        let min = version(tls.min_version.as_deref(), "min_version", 12)?;
        let max = version(tls.max_version.as_deref(), "max_version", 13)?;
        if min > max {
            bail!("tls_server_config.min_version is above max_version");
        }
        [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, v)| v)
            .collect()
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .context("TLS versions")?;
    let builder = match tls.client_auth_type.as_deref() {
        None | Some("NoClientCert") => {
            if tls.client_ca_file.is_some() {
                bail!("client_ca_file needs client_auth_type: RequireAndVerifyClientCert");
            }
            builder.with_no_client_auth()
        }
        Some("RequireAndVerifyClientCert") => {
            let Some(ca_file) = &tls.client_ca_file else {
                bail!("client_auth_type RequireAndVerifyClientCert needs client_ca_file");
            };
            let ca_path = resolve(ca_file);
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&ca_path)
                .map_err(|e| anyhow::anyhow!("cannot read '{}': {e}", ca_path.display()))?
            {
                let cert =
                    cert.map_err(|e| anyhow::anyhow!("cannot read '{}': {e}", ca_path.display()))?;
                roots
                    .add(cert)
                    .with_context(|| format!("bad CA certificate in '{}'", ca_path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        Some(other) => bail!(
            "client_auth_type '{other}' is not supported; use RequireAndVerifyClientCert (the \
             only secure choice with client certificates) or leave it out"
        ),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the certificate and key do not make a TLS identity")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn version(value: Option<&str>, key: &str, default: u8) -> anyhow::Result<u8> {
    match value {
        None => Ok(default),
        Some("TLS12") => Ok(12),
        Some("TLS13") => Ok(13),
        Some(other) => {
            bail!("tls_server_config.{key} '{other}' is not supported; use TLS12 or TLS13")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_files(dir: &Path) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        std::fs::write(dir.join("cert.pem"), cert.cert.pem()).expect("write");
        std::fs::write(dir.join("key.pem"), cert.key_pair.serialize_pem()).expect("write");
    }

    #[test]
    fn empty_file_is_plain_http() {
        let config = WebConfig::parse("", Path::new(".")).expect("valid");
        assert!(config.tls.is_none() && config.auth.is_none());
    }

    #[test]
    fn toolkit_file_with_relative_paths_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        cert_files(dir.path());
        let hash = bcrypt::hash("secret", 4).expect("hash");
        let text = format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS13\n\
             basic_auth_users:\n  prometheus: {hash}\n\
             http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
        );
        let path = dir.path().join("web.yml");
        std::fs::write(&path, text).expect("write");
        let config = WebConfig::load(&path).expect("valid");
        assert!(config.tls.is_some());
        assert!(config.auth.is_some());
        assert_eq!(
            config.headers,
            vec![("X-Content-Type-Options".to_owned(), "nosniff".to_owned())]
        );
    }

    #[test]
    fn unsupported_and_unknown_keys_are_refused() {
        let err =
            WebConfig::parse("rate_limit:\n  interval: 1s\n", Path::new(".")).expect_err("refused");
        assert!(
            format!("{err:#}").contains("'rate_limit' is not supported"),
            "{err:#}"
        );
        let err = WebConfig::parse("basic_auth_user:\n  a: b\n", Path::new(".")).expect_err("typo");
        assert!(format!("{err:#}").contains("unknown field"), "{err:#}");
        let err = WebConfig::parse(
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n",
            Path::new("."),
        )
        .expect_err("refused");
        assert!(format!("{err:#}").contains("cipher_suites"), "{err:#}");
    }

    #[test]
    fn plain_passwords_are_refused() {
        let err = WebConfig::parse("basic_auth_users:\n  alice: hunter2\n", Path::new("."))
            .expect_err("not a hash");
        assert!(format!("{err:#}").contains("'alice'"), "{err:#}");
    }

    #[test]
    fn missing_certificate_names_the_file() {
        let err = WebConfig::parse(
            "tls_server_config:\n  cert_file: /nonexistent/cert.pem\n  key_file: k.pem\n",
            Path::new("."),
        )
        .expect_err("missing");
        assert!(
            format!("{err:#}").contains("/nonexistent/cert.pem"),
            "{err:#}"
        );
    }

    #[test]
    fn weak_client_auth_types_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        cert_files(dir.path());
        let text = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  \
                    client_auth_type: RequestClientCert\n";
        let err = WebConfig::parse(text, dir.path()).expect_err("insecure");
        assert!(
            format!("{err:#}").contains("RequireAndVerifyClientCert"),
            "{err:#}"
        );
    }
}
