//! The cluster key and the AEAD every datagram is sealed with.
//!
//! Apart from the codec because it is the one part that holds a secret and
//! calls into cryptography: the key derivation (HMAC-SHA256 of the secret
//! and the cluster name), the nonce (the datagram's salt and sequence
//! number) and XChaCha20-Poly1305's seal and open. The rest of the format
//! sees only [`ClusterKey`] and [`seal`]; see the parent module's "Design"
//! for why the nonce is built this way.

use std::fmt;

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{KeyInit as AeadKeyInit, Tag, XChaCha20Poly1305, XNonce};
use hmac::digest::{Key as BlockKey, KeyInit};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::{SALT_LEN, TAG_LEN};

/// What the key derivation mixes in before the cluster name.
const KDF_LABEL: &[u8] = b"tollgate gossip v2";

/// The key datagrams are encrypted and authenticated under, derived from
/// the cluster's secret and its name: the XChaCha20-Poly1305 key
/// HMAC-SHA256(secret, `"tollgate gossip v2"` || name). Binding the name
/// means two clusters that share a secret still cannot read or talk to
/// each other.
///
/// Its `Debug` shows no key material, and the key is zeroed when dropped.
#[derive(Clone)]
pub struct ClusterKey {
    aead: XChaCha20Poly1305,
}

impl ClusterKey {
    /// Derives the key of cluster `cluster_name` from the shared `secret`.
    pub fn new(secret: &[u8], cluster_name: &str) -> ClusterKey {
        let mut kdf = keyed(secret);
        kdf.update(KDF_LABEL);
        kdf.update(cluster_name.as_bytes());
        let derived: [u8; 32] = kdf.finalize().into_bytes().into();
        ClusterKey {
            aead: <XChaCha20Poly1305 as AeadKeyInit>::new(&derived.into()),
        }
    }

    /// Encrypts `plaintext` in place, authenticating `clear` (the header
    /// and the salt, which ends it) with it, and answers the tag; `None`
    /// only for a message too long for the cipher, which no datagram is.
    fn seal(&self, clear: &[u8], seq: u64, plaintext: &mut [u8]) -> Option<[u8; TAG_LEN]> {
        let nonce = nonce(clear, seq)?;
        let tag = self
            .aead
            .encrypt_inout_detached(&nonce, clear, plaintext.into())
            .ok()?;
        Some(tag.into())
    }

    /// Decrypts `sealed` in place if `tag` authenticates it and `clear`
    /// (the header and the salt, which ends it); whether it did. On
    /// failure `sealed` holds garbage.
    pub(super) fn open(&self, clear: &[u8], seq: u64, sealed: &mut [u8], tag: &[u8]) -> bool {
        let (Some(nonce), Ok(tag)) = (nonce(clear, seq), Tag::try_from(tag)) else {
            return false;
        };
        self.aead
            .decrypt_inout_detached(&nonce, clear, sealed.into(), &tag)
            .is_ok()
    }
}

/// The nonce of a datagram whose clear part (header and salt) is `clear`:
/// the salt, then the sequence number. `None` if `clear` is shorter than
/// a salt.
fn nonce(clear: &[u8], seq: u64) -> Option<XNonce> {
    let salt = clear
        .len()
        .checked_sub(SALT_LEN)
        .and_then(|at| clear.get(at..))?;
    let mut nonce = [0u8; SALT_LEN + 8];
    nonce[..SALT_LEN].copy_from_slice(salt);
    nonce[SALT_LEN..].copy_from_slice(&seq.to_le_bytes());
    Some(nonce.into())
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterKey").finish_non_exhaustive()
    }
}

/// HMAC-SHA256 under a key of any length. The key is brought to the block
/// size as RFC 2104 §2 does (hashed when longer, zero-padded), which is
/// what HMAC does itself; doing it here reaches the infallible fixed-size
/// constructor rather than `new_from_slice`, whose `Result` cannot fail for
/// HMAC but would still need unwrapping.
fn keyed(key: &[u8]) -> Hmac<Sha256> {
    let mut block = BlockKey::<Hmac<Sha256>>::default();
    if key.len() > block.len() {
        let digest = Sha256::digest(key);
        block[..digest.len()].copy_from_slice(&digest);
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    <Hmac<Sha256> as KeyInit>::new(&block)
}

/// Encrypts `out` past its first `clear` bytes (header and salt) in place
/// and appends the tag; `false`, leaving `out` unusable, in the
/// unreachable case of a message too long for the cipher.
pub(super) fn seal(key: &ClusterKey, out: &mut Vec<u8>, clear: usize, seq: u64) -> bool {
    let Some((head, plaintext)) = out.split_at_mut_checked(clear) else {
        return false;
    };
    match key.seal(head, seq, plaintext) {
        Some(tag) => {
            out.extend_from_slice(&tag);
            true
        }
        None => false,
    }
}
