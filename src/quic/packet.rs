//! What the endpoint answers without a connection: Version Negotiation for a packet of a
//! QUIC version tlsterm does not speak, and the stateless Retry of a new connection.
//! Neither answer is larger than the datagram that asked for it, so neither can be used to
//! amplify traffic toward a forged source address.

use std::net::SocketAddr;

use super::cid;
use super::token;

/// The smallest datagram that may carry a client's first Initial packet (RFC 9000, 14.1);
/// a smaller one is dropped, and gets no Retry or Version Negotiation.
pub const MIN_INITIAL_DATAGRAM: usize = 1200;

/// The long-header bit of a packet's first byte (RFC 8999, 5.1).
const LONG_HEADER: u8 = 0x80;

/// Room for a Version Negotiation or Retry packet: a header with two connection IDs of at
/// most 255 bytes each (the version-independent limit), a version list or token, a tag.
const ANSWER_ROOM: usize = 1 + 4 + 2 * (1 + 255) + 128;

/// What a datagram is, as the endpoint first reads it, before any connection's state. The
/// endpoint and the packet path's fuzz target both read datagrams through [`arrival`], so
/// the order of its checks is the endpoint's own.
pub enum Arrival {
    /// A long header of a version tlsterm does not speak, in a datagram that could open a
    /// connection: the Version Negotiation packet that answers it.
    OtherVersion(Vec<u8>),
    /// A short header, an established connection's packet: its destination ID.
    Established([u8; cid::CID_LEN]),
    /// Any other header quiche reads (a long header of a version it speaks).
    Parsed(quiche::Header<'static>),
    /// Nothing quiche can read: dropped.
    Unreadable,
}

/// Reads `datagram` (quiche's header parser needs it writable, and leaves it as it was).
pub fn arrival(datagram: &mut [u8]) -> Arrival {
    if let Some(answer) = version_negotiation(datagram) {
        return Arrival::OtherVersion(answer);
    }
    if let Some(dcid) = short_header_dcid(datagram) {
        return Arrival::Established(dcid.try_into().expect("an ID of CID_LEN bytes"));
    }
    match quiche::Header::from_slice(datagram, cid::CID_LEN) {
        Ok(header) => Arrival::Parsed(header),
        Err(_) => Arrival::Unreadable,
    }
}

/// The Version Negotiation packet answering `datagram`, if it starts with a long header of
/// a version quiche does not speak and is large enough to open a connection. Read from the
/// version-independent header only (RFC 8999): a version's own fields may mean anything.
fn version_negotiation(datagram: &[u8]) -> Option<Vec<u8>> {
    let (dcid, scid) = unsupported_version_ids(datagram)?;
    if datagram.len() < MIN_INITIAL_DATAGRAM {
        return None;
    }
    let mut out = vec![0u8; ANSWER_ROOM];
    // The answer goes to the client's source ID from the ID it wrote to.
    let len = quiche::negotiate_version(
        &quiche::ConnectionId::from_ref(scid),
        &quiche::ConnectionId::from_ref(dcid),
        &mut out,
    )
    .ok()?;
    out.truncate(len);
    Some(out)
}

/// The destination connection ID of a short-header packet, which names a connection of
/// this endpoint (tlsterm's IDs are all `cid::CID_LEN` bytes): read in place, where
/// quiche's header parser copies both IDs into new vectors, for every packet of every
/// established connection. `None` for a long header, or a datagram too short to hold one.
fn short_header_dcid(datagram: &[u8]) -> Option<&[u8]> {
    let first = *datagram.first()?;
    if first & LONG_HEADER != 0 {
        return None;
    }
    datagram.get(1..1 + cid::CID_LEN)
}

/// The destination and source connection IDs of a long-header packet of an unsupported
/// version (0, Version Negotiation itself, excluded).
fn unsupported_version_ids(datagram: &[u8]) -> Option<(&[u8], &[u8])> {
    let first = *datagram.first()?;
    if first & LONG_HEADER == 0 {
        return None;
    }
    let version = u32::from_be_bytes(datagram.get(1..5)?.try_into().ok()?);
    if version == 0 || quiche::version_is_supported(version) {
        return None;
    }
    let dcid_len = *datagram.get(5)? as usize;
    let dcid = datagram.get(6..6 + dcid_len)?;
    let scid_len = *datagram.get(6 + dcid_len)? as usize;
    let scid = datagram.get(7 + dcid_len..7 + dcid_len + scid_len)?;
    Some((dcid, scid))
}

/// A Retry for the client Initial `header`, from `client`, naming a new connection ID of
/// `worker` (so that the client's next Initial comes back to this worker) and carrying a
/// token for it.
pub fn retry(
    header: &quiche::Header<'_>,
    client: SocketAddr,
    worker: usize,
) -> quiche::Result<Vec<u8>> {
    let retry_cid = cid::generate(worker);
    let token = token::issue(client, &header.dcid, &retry_cid);
    let mut out = vec![0u8; ANSWER_ROOM];
    let len = quiche::retry(
        &header.scid,
        &header.dcid,
        &quiche::ConnectionId::from_ref(&retry_cid),
        &token,
        header.version,
        &mut out,
    )?;
    out.truncate(len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The packet path before quiche, on any datagram: nothing panics; a Version
        /// Negotiation answer goes only to a datagram large enough to open a connection and
        /// is never larger than it (no amplification); an established connection's packet
        /// is routed by the very ID quiche reads, which names a worker.
        #[test]
        fn any_datagram_is_answered_safely_and_routed_as_quiche_reads_it(
            datagram in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..1500),
                (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..24),
                 proptest::collection::vec(any::<u8>(), 0..24), 0..1500usize)
                    .prop_map(|(version, dcid, scid, size)| {
                        long_header(version, &dcid, &scid, size.max(7 + dcid.len() + scid.len()))
                    }),
            ]
        ) {
            if let Some(answer) = version_negotiation(&datagram) {
                prop_assert!(datagram.len() >= MIN_INITIAL_DATAGRAM);
                prop_assert!(answer.len() <= datagram.len());
            }
            if let Some(dcid) = short_header_dcid(&datagram) {
                prop_assert!(cid::worker_of(dcid, 4).is_some());
                let mut copy = datagram.clone();
                if let Ok(header) = quiche::Header::from_slice(&mut copy, cid::CID_LEN) {
                    prop_assert_eq!(header.ty, quiche::Type::Short);
                    prop_assert_eq!(header.dcid.as_ref(), dcid);
                }
            }
        }
    }

    #[test]
    fn a_short_header_names_its_connection_in_place() {
        let mut packet = vec![0x40];
        packet.extend(1..=cid::CID_LEN as u8);
        packet.extend([0xaa; 20]);
        let dcid = short_header_dcid(&packet).unwrap();
        assert_eq!(dcid, (1..=cid::CID_LEN as u8).collect::<Vec<_>>());
        // What quiche reads, for the same packet.
        let header = quiche::Header::from_slice(&mut packet.clone(), cid::CID_LEN).unwrap();
        assert_eq!(header.dcid.as_ref(), dcid);
        // Too short for an ID, or a long header: none.
        assert_eq!(short_header_dcid(&packet[..cid::CID_LEN]), None);
        assert_eq!(short_header_dcid(&[]), None);
        let long = long_header(1, &[1; 8], &[2; 8], MIN_INITIAL_DATAGRAM);
        assert_eq!(short_header_dcid(&long), None);
    }

    /// A long-header datagram of `version`, padded to `size`.
    fn long_header(version: u32, dcid: &[u8], scid: &[u8], size: usize) -> Vec<u8> {
        let mut packet = vec![0xc0];
        packet.extend_from_slice(&version.to_be_bytes());
        packet.push(dcid.len() as u8);
        packet.extend_from_slice(dcid);
        packet.push(scid.len() as u8);
        packet.extend_from_slice(scid);
        packet.resize(size, 0);
        packet
    }

    #[test]
    fn an_unknown_version_gets_the_versions_tlsterm_speaks() {
        let packet = long_header(0x1a2a_3a4a, b"server-side", b"client", 1200);
        let mut answer = version_negotiation(&packet).expect("an answer");
        let header = quiche::Header::from_slice(&mut answer, 0).unwrap();
        assert_eq!(header.ty, quiche::Type::VersionNegotiation);
        assert_eq!(header.dcid.as_ref(), b"client");
        assert_eq!(header.scid.as_ref(), b"server-side");
        assert_eq!(header.versions, Some(vec![quiche::PROTOCOL_VERSION]));
    }

    #[test]
    fn no_answer_to_a_known_version_a_short_datagram_or_a_short_header() {
        let known = long_header(quiche::PROTOCOL_VERSION, b"abcdefgh", b"c", 1200);
        assert!(version_negotiation(&known).is_none());
        let negotiation = long_header(0, b"abcdefgh", b"c", 1200);
        assert!(version_negotiation(&negotiation).is_none());
        let short = long_header(0x1a2a_3a4a, b"abcdefgh", b"c", 1199);
        assert!(version_negotiation(&short).is_none());
        let mut short_header = long_header(0x1a2a_3a4a, b"abcdefgh", b"c", 1200);
        short_header[0] = 0x40;
        assert!(version_negotiation(&short_header).is_none());
        // IDs longer than the datagram.
        assert!(version_negotiation(&[0xc0, 1, 2, 3, 4, 200, 1]).is_none());
    }

    #[test]
    fn a_retry_names_the_worker_and_carries_a_token_for_the_client() {
        let client: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        // Its token length is zero, as in a client's first Initial.
        let mut initial = long_header(quiche::PROTOCOL_VERSION, b"original", b"client", 1200);
        let header = quiche::Header::from_slice(&mut initial, cid::CID_LEN).unwrap();
        let mut answer = retry(&header, client, 3).unwrap();
        assert!(answer.len() < MIN_INITIAL_DATAGRAM);
        let retry = quiche::Header::from_slice(&mut answer, 0).unwrap();
        assert_eq!(retry.ty, quiche::Type::Retry);
        assert_eq!(retry.dcid.as_ref(), b"client");
        assert_eq!(cid::worker_of(&retry.scid, 8), Some(3));
        let token = retry.token.unwrap();
        assert_eq!(
            token::check(&token, client, &retry.scid),
            Ok(b"original".to_vec())
        );
    }
}
