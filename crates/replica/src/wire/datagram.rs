//! One datagram: [`encode`] and [`decode`], the framing around a body.
//!
//! Apart from the bodies because this is where the order of checks lives,
//! the order that makes each failure cheap and countable (size, magic and
//! version, cluster tag, then the AEAD, and only then the body parser; see
//! the parent module's "Design"). It joins the header, the seal and the
//! body codec and adds nothing of its own to the format.

use super::bytes::Reader;
use super::header::{put_clear, read_header, Header};
use super::message::{put_body, read_body, Body, Message};
use super::seal::{seal, ClusterKey};
#[cfg(doc)]
use super::{cluster_tag, encode_items, ReplayGuard};
use super::{WireError, FIXED_HEADER, MAGIC, MAX_DATAGRAM, SALT_LEN, TAG_LEN, TRUNCATED, VERSION};

/// Encodes one datagram.
///
/// Fails with [`WireError::Oversized`] when it would exceed
/// [`MAX_DATAGRAM`] (use [`encode_items`] for items that may not fit) and
/// with [`WireError::DomainTooLong`] for an item whose domain does.
pub fn encode(key: &ClusterKey, header: &Header, body: &Body) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    let clear = put_clear(&mut out, header);
    put_body(&mut out, header, body)?;
    let len = out.len() + TAG_LEN;
    if len > MAX_DATAGRAM || !seal(key, &mut out, clear, header.seq) {
        return Err(WireError::Oversized(len));
    }
    Ok(out)
}

/// Decodes, authenticates and decrypts one datagram of the cluster tagged
/// `expected_cluster` (normally [`cluster_tag`] of the name `key` was
/// derived from).
///
/// Checks, in this order: size ([`WireError::Oversized`]), magic and
/// version, cluster tag ([`WireError::ForeignCluster`]), the AEAD
/// ([`WireError::BadMac`]: also a header that does not parse, or a
/// datagram too short for the salt and tag, since neither can be
/// authentic), then parses the decrypted body strictly
/// ([`WireError::Malformed`]). Never panics, whatever `bytes` hold, and
/// allocates in proportion to their length: it decrypts into a buffer on
/// the stack, counts are capped by what the rest of the datagram could
/// hold, and the worst case, an interned 512-byte domain copied into every
/// key of a datagram of five-byte items, is about 120 KB. It checks
/// neither the recipient ([`Header::is_for`]) nor replays (pass the header
/// to a [`ReplayGuard`]): the node does both.
pub fn decode(key: &ClusterKey, expected_cluster: u64, bytes: &[u8]) -> Result<Message, WireError> {
    if bytes.len() > MAX_DATAGRAM {
        return Err(WireError::Oversized(bytes.len()));
    }
    if bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return Err(WireError::BadMagic);
    }
    let version = *bytes.get(MAGIC.len()).ok_or(TRUNCATED)?;
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let cluster = bytes
        .get(3..FIXED_HEADER)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .ok_or(TRUNCATED)?;
    if cluster != expected_cluster {
        return Err(WireError::ForeignCluster(cluster));
    }

    // The header, in the clear but not yet authenticated: whatever is
    // wrong with it is a failure to authenticate.
    let mut r = Reader::new(bytes.get(FIXED_HEADER..).unwrap_or_default());
    let header = read_header(&mut r, cluster).map_err(|_| WireError::BadMac)?;
    let clear_len = bytes.len() - r.remaining() + SALT_LEN;
    let sealed_len = bytes
        .len()
        .checked_sub(clear_len + TAG_LEN)
        .ok_or(WireError::BadMac)?;
    let (clear, rest) = bytes.split_at(clear_len);
    let (sealed, tag) = rest.split_at(sealed_len);
    let mut buf = [0u8; MAX_DATAGRAM];
    let plain = buf.get_mut(..sealed_len).ok_or(WireError::BadMac)?;
    plain.copy_from_slice(sealed);
    if !key.open(clear, header.seq, plain, tag) {
        return Err(WireError::BadMac);
    }

    let body = read_body(Reader::new(plain), &header)?;
    Ok(Message { header, body })
}
