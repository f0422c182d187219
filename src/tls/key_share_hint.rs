//! The server's key share, computed by tlsterm and handed to BoringSSL as a handshake hint.
//!
//! BoringSSL has no asynchronous hook for its (EC)DHE share, but it takes "handshake
//! hints" (`SSL_set_handshake_hints`, made for split handshakes): when a hint's key share
//! names the group BoringSSL selects, `resolve_ecdhe_secret` (ssl/tls13_server.cc) uses
//! the hint's server share and secret instead of computing them. So the certificate
//! callback predicts the group from the ClientHello, has the share computed by
//! `offload::key_share`, and sets the hint before BoringSSL resolves the key share.
//!
//! The prediction follows BoringSSL 5.4's `tls1_get_shared_group` without
//! `SSL_OP_CIPHER_SERVER_PREFERENCE` (tlsterm never sets it): the client's first
//! supported group that the listener offers; then the client's key share of that group
//! (none: a HelloRetryRequest follows, and no hint is set). A wrong prediction costs only
//! the work: BoringSSL ignores a hint of another group and computes its own share. The hint
//! is trusted as given, which is why it is computed from the very share BoringSSL will
//! use, for this connection only. After the handshake, `record` counts whether the hint was
//! applied: a BoringSSL upgrade that stops applying hints shows as `not_applied`, and
//! `tests/suite/key_shares.rs` fails on it.

use std::sync::LazyLock;

use boring::ex_data::Index;
use boring::ssl::{ClientHello, ExtensionType, Ssl, SslRef, SslVersion};
use der::asn1::OctetStringRef;
use der::{Encode, Sequence};
use zeroize::Zeroizing;

use super::select::u16_list;
use crate::offload::key_share::{Group, ServerShare};
use crate::offload::KeySharePath;

/// The group of the hint set on a connection, and who computed it.
static HINTED: LazyLock<Index<Ssl, (u16, KeySharePath)>> =
    LazyLock::new(|| Ssl::new_ex_index().expect("an SSL ex_data index"));

/// What the server's share will be computed from: the group BoringSSL will select and the
/// client's share of it.
pub(super) struct KeyShareRequest {
    pub(super) group: Group,
    pub(super) peer: Vec<u8>,
}

const TLS13: u16 = 0x0304;

/// The group and client share of the TLS 1.3 key exchange this ClientHello will lead to,
/// if tlsterm computes that group's shares. `listener_groups`: the listener's group code
/// points in its configured order.
pub(super) fn request(hello: &ClientHello<'_>, listener_groups: &[u16]) -> Option<KeyShareRequest> {
    let offers_tls13 = hello
        .get_extension(ExtensionType::SUPPORTED_VERSIONS)
        .is_some_and(|versions| u16_list(versions, 1).any(|v| v == TLS13));
    if !offers_tls13 {
        return None;
    }
    let groups = hello.get_extension(ExtensionType::SUPPORTED_GROUPS)?;
    let selected = u16_list(groups, 2).find(|g| listener_groups.contains(g))?;
    let group = Group::from_id(selected)?;
    let key_shares = hello.get_extension(ExtensionType::KEY_SHARE)?;
    let peer = client_share(key_shares, selected)?;
    Some(KeyShareRequest {
        group,
        peer: peer.to_vec(),
    })
}

/// The client's share of `group` in a key_share extension; `None` when it has none, or
/// the extension is malformed or names the group twice (BoringSSL refuses both).
fn client_share(extension: &[u8], group: u16) -> Option<&[u8]> {
    let (length, mut rest) = extension.split_first_chunk::<2>()?;
    if usize::from(u16::from_be_bytes(*length)) != rest.len() {
        return None;
    }
    let mut found = None;
    while !rest.is_empty() {
        let (id, after) = rest.split_first_chunk::<2>()?;
        let (length, after) = after.split_first_chunk::<2>()?;
        let length = usize::from(u16::from_be_bytes(*length));
        if length == 0 || after.len() < length {
            return None;
        }
        let (share, after) = after.split_at(length);
        if u16::from_be_bytes(*id) == group {
            if found.is_some() {
                return None;
            }
            found = Some(share);
        }
        rest = after;
    }
    found
}

/// `KeyShareHint` of BoringSSL's `HandshakeHints` (ssl/handoff.cc).
#[derive(Sequence)]
struct KeyShareHint<'a> {
    group_id: u16,
    ciphertext: OctetStringRef<'a>,
    secret: OctetStringRef<'a>,
}

/// BoringSSL's `HandshakeHints`, of which tlsterm sets only the key share (`[1]`): every
/// other field absent leaves that step to BoringSSL.
#[derive(Sequence)]
struct HandshakeHints<'a> {
    #[asn1(context_specific = "1", tag_mode = "IMPLICIT", optional = "true")]
    key_share: Option<KeyShareHint<'a>>,
}

/// The DER hints that carry `share` (wiped when dropped: it holds the secret).
fn encode(share: &ServerShare) -> Option<Zeroizing<Vec<u8>>> {
    let hints = HandshakeHints {
        key_share: Some(KeyShareHint {
            group_id: share.group.id(),
            ciphertext: OctetStringRef::new(&share.public).ok()?,
            secret: OctetStringRef::new(&share.secret).ok()?,
        }),
    };
    let mut der = Zeroizing::new(Vec::with_capacity(share.public.len() + 96));
    hints.encode_to_vec(&mut der).ok()?;
    Some(der)
}

/// Sets `share` as this connection's key-share hint; false if BoringSSL refused it (the
/// handshake then computes its own share).
pub(super) fn apply(ssl: &mut SslRef, share: &ServerShare, path: KeySharePath) -> bool {
    let Some(der) = encode(share) else {
        return false;
    };
    if !crate::sys::set_handshake_hints(ssl, &der) {
        return false;
    }
    ssl.set_ex_data(*HINTED, (share.group.id(), path));
    true
}

/// Counts the key share of a completed handshake: by the path that computed it, and a
/// hint BoringSSL did not use as `not_applied` (its share was then computed inline).
pub fn record(ssl: &SslRef) {
    use crate::offload::metrics::record_key_share;
    // A TLS 1.2 resumption has no key exchange (BoringSSL still reports the group of the
    // session's first handshake).
    let tls12_resumption = ssl.session_reused() && ssl.version2() != Some(SslVersion::TLS1_3);
    let (Some(negotiated), Some(label), false) = (ssl.curve(), ssl.curve_name(), tls12_resumption)
    else {
        return;
    };
    match ssl.ex_data(*HINTED) {
        Some(&(hinted, path)) if hinted == negotiated => record_key_share(label, path.label()),
        Some(&(hinted, _)) => {
            let hinted = Group::from_id(hinted).map_or("other", Group::label);
            record_key_share(hinted, "not_applied");
            record_key_share(label, KeySharePath::Inline.label());
        }
        None => record_key_share(label, KeySharePath::Inline.label()),
    }
}

#[cfg(test)]
mod tests;
