//! What tollgate's TLS users share: the server (its ports, and the
//! OpenTelemetry collector it exports to), the client, and the Redis
//! store.
//!
//! - Reading PEM material: a certificate chain ([`certificates`]), a
//!   private key ([`private_key`]) and a CA bundle ([`trust_anchors`]),
//!   with errors ([`PemError`]) that say what is wrong and never quote a
//!   key.
//! - Naming why rustls refused a certificate where rustls only passes
//!   webpki's error through ([`is_x509_v1`], [`is_ca_as_leaf`]), and
//!   where the rules and the commands that make certificates that work are
//!   written down ([`HOW_TO_MAKE_CERTIFICATES`]).
//! - Quoting a TLS error in a log line or a message without letting the
//!   peer choose its length ([`bounded`]): rustls's errors carry what the
//!   peer's certificate says (its names, its key usages), and a peer can
//!   put thousands of them in one.
//! - The crypto provider to build rustls settings with ([`crypto_provider`]).
//!
//! What is not here: connecting, serving, or deciding what to do about a
//! failure; each crate says that in its own words.
//!
//! **Why a crate of its own:** the client must not depend on the server
//! (a program that only asks for limits would build the whole server),
//! the Redis store depends on neither, and the crates all three already
//! share (core, proto) are about limiting and the wire format, and have no
//! business knowing rustls. The three used to carry a copy each of the
//! PEM reading and of the webpki error lookup, and the copies had begun
//! to differ.

#![deny(missing_docs)]

use std::fmt::{self, Write as _};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{CertificateError, RootCertStore};

/// Where the rules for certificates, and commands that make certificates
/// that work, are written down (for errors that send the reader there).
pub const HOW_TO_MAKE_CERTIFICATES: &str = "docs/server.md, \"Making certificates\"";

/// Whether rustls refused a certificate for being X.509 v1. webpki reads
/// v3 certificates only (a v1 certificate has no extensions: no
/// subjectAltName, key usage or CA flag to check), so a v1 server
/// certificate cannot be served and a v1 client certificate is refused
/// in the handshake. A v1 CA certificate is fine as a trust anchor.
pub fn is_x509_v1(e: &CertificateError) -> bool {
    matches!(webpki_error(e), Some(webpki::Error::UnsupportedCertVersion))
}

/// Whether rustls refused a certificate for being a CA's (basicConstraints
/// CA:TRUE) where a leaf was expected: a self-signed certificate made with
/// `openssl req -x509`, say, presented as a server's or a client's own.
pub fn is_ca_as_leaf(e: &CertificateError) -> bool {
    matches!(webpki_error(e), Some(webpki::Error::CaUsedAsEndEntity))
}

/// webpki's error behind rustls's, which passes the ones it has no variant
/// for through as `Other`.
fn webpki_error(e: &CertificateError) -> Option<&webpki::Error> {
    match e {
        CertificateError::Other(other) => other.0.downcast_ref::<webpki::Error>(),
        _ => None,
    }
}

/// The longest text [`bounded`] gives, in bytes (before its ellipsis).
pub const BOUNDED_BYTES: usize = 300;

/// `text` as a string of at most [`BOUNDED_BYTES`] bytes (cut at a
/// character boundary, the cut marked with `…`), for a TLS error quoted in
/// a log line or an error message. rustls's errors quote the peer's
/// certificate (`certificate does not allow extended key usage for
/// client authentication, allows ...` lists every usage it names), so
/// their length is the peer's choice. The text is never built in full.
pub fn bounded(text: impl fmt::Display) -> String {
    struct Cut {
        out: String,
        full: bool,
    }
    impl fmt::Write for Cut {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            if self.full {
                return Err(fmt::Error);
            }
            let room = BOUNDED_BYTES - self.out.len();
            if s.len() <= room {
                self.out.push_str(s);
                return Ok(());
            }
            let mut end = room;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            self.out.push_str(&s[..end]);
            self.out.push('…');
            self.full = true;
            // Stops the formatting: nothing more is wanted.
            Err(fmt::Error)
        }
    }
    let mut cut = Cut {
        out: String::new(),
        full: false,
    };
    // An error here is the cut, or a `Display` that failed: what was
    // written so far is the text either way.
    let _ = write!(cut, "{text}");
    cut.out
}

/// The crypto provider rustls settings are built with: the process's
/// default when one is installed (as tonic and redis-rs do), else ring,
/// the one every tollgate crate compiles in.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// What is wrong with a PEM file. Never quotes its content: a key's bytes
/// must not reach a log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PemError {
    /// A PEM block is broken (its end line is missing, its base64 does not
    /// decode, ...).
    #[error("not valid PEM: {0}")]
    NotPem(String),
    /// No `CERTIFICATE` block (a key file given for a certificate, say).
    #[error("no CERTIFICATE block found")]
    NoCertificate,
    /// No private key block of a kind rustls reads.
    #[error("no usable PRIVATE KEY block found (PKCS#8, PKCS#1 or SEC1 PEM expected)")]
    NoPrivateKey,
    /// A certificate of a CA bundle cannot be a trust anchor (its DER does
    /// not parse), and every one must be ([`Anchors::Every`]).
    #[error("not a usable CA certificate: {0}")]
    UnusableCa(String),
    /// None of the bundle's certificates can be a trust anchor
    /// ([`Anchors::Usable`]).
    #[error("none of its {0} certificate(s) is a usable CA certificate")]
    NoUsableCa(usize),
}

/// The certificates of `pem`, in order (a chain: the leaf first): at
/// least one.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PemError::NotPem(bounded(e)))?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// The first private key of `pem` (PKCS#8, PKCS#1 or SEC1). The parser's
/// own error is not kept: it may describe the key's text.
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|_| PemError::NoPrivateKey)
}

/// Which certificates of a CA bundle [`trust_anchors`] requires to be
/// usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchors {
    /// Every one, or the bundle is refused: for settings tollgate applies
    /// itself (the server's client CA), where a broken entry is better
    /// named than ignored, and for redis-rs, which refuses such a bundle
    /// at its first connection.
    Every,
    /// Those that parse, skipping the others, as tonic does
    /// (`add_parsable_certificates`): for settings tonic applies (the
    /// client's CA, the OpenTelemetry collector's), so that the check
    /// refuses exactly what would not work. At least one must be usable.
    Usable,
}

/// The CA certificates of `pem` as trust anchors: at least one, and every
/// one or only the usable ones as `which` says.
pub fn trust_anchors(pem: &[u8], which: Anchors) -> Result<RootCertStore, PemError> {
    let certs = certificates(pem)?;
    let mut roots = RootCertStore::empty();
    match which {
        Anchors::Every => {
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| PemError::UnusableCa(bounded(e)))?;
            }
        }
        Anchors::Usable => {
            let total = certs.len();
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(PemError::NoUsableCa(total));
            }
        }
    }
    Ok(roots)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A PEM block whose base64 decodes, but not to a certificate.
    const NOT_DER: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

    #[test]
    fn bounded_text_stops_at_its_bound_on_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(10_000);
        let cut = bounded(&long);
        assert!(cut.len() <= BOUNDED_BYTES + '…'.len_utf8(), "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
        // A `Display` that writes in many pieces is cut the same way.
        struct Many;
        impl fmt::Display for Many {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for i in 0..100_000 {
                    write!(f, "eku {i}, ")?;
                }
                Ok(())
            }
        }
        let cut = bounded(Many);
        assert!(cut.starts_with("eku 0, eku 1, "), "{cut}");
        assert!(cut.len() <= BOUNDED_BYTES + '…'.len_utf8(), "{}", cut.len());
    }

    #[test]
    fn a_file_without_a_certificate_or_key_is_named_so() {
        assert_eq!(certificates(b"nothing here"), Err(PemError::NoCertificate));
        assert!(matches!(
            certificates(b"-----BEGIN CERTIFICATE-----\nAAAA\n"),
            Err(PemError::NotPem(_))
        ));
        // A certificate file given as the key.
        assert!(matches!(
            private_key(include_bytes!("../../../examples/tls/ca.pem")),
            Err(PemError::NoPrivateKey)
        ));
    }

    #[test]
    fn a_bundle_with_an_unusable_certificate_is_refused_only_when_every_one_must_do() {
        assert!(matches!(
            trust_anchors(NOT_DER.as_bytes(), Anchors::Every),
            Err(PemError::UnusableCa(_))
        ));
        assert_eq!(
            trust_anchors(NOT_DER.as_bytes(), Anchors::Usable).err(),
            Some(PemError::NoUsableCa(1))
        );
        assert_eq!(
            trust_anchors(b"", Anchors::Usable).err(),
            Some(PemError::NoCertificate)
        );
        // A usable CA next to it: tonic would trust that one.
        let ca = include_str!("../../../examples/tls/ca.pem");
        let bundle = format!("{NOT_DER}{ca}");
        let roots = trust_anchors(bundle.as_bytes(), Anchors::Usable).unwrap();
        assert_eq!(roots.len(), 1);
        assert!(trust_anchors(bundle.as_bytes(), Anchors::Every).is_err());
        assert_eq!(
            trust_anchors(ca.as_bytes(), Anchors::Every).map(|r| r.len()),
            Ok(1)
        );
    }

    #[test]
    fn webpki_errors_behind_rustls_are_named() {
        let other = |e: webpki::Error| CertificateError::Other(rustls::OtherError(Arc::new(e)));
        assert!(is_x509_v1(&other(webpki::Error::UnsupportedCertVersion)));
        assert!(!is_x509_v1(&CertificateError::UnknownIssuer));
        assert!(is_ca_as_leaf(&other(webpki::Error::CaUsedAsEndEntity)));
        assert!(!is_ca_as_leaf(&other(
            webpki::Error::UnsupportedCertVersion
        )));
    }
}
