//! Connection IDs that name the worker serving the connection: the first two bytes are
//! the worker's index, the rest random. The reuseport program (`sys::steer_by_cid`) reads
//! them from each packet's destination connection ID and hands the packet to that
//! worker's socket, wherever the packet came from.

use boring::rand::rand_bytes;

/// The length of the connection IDs tlsterm issues.
pub const CID_LEN: usize = 16;
/// Where the worker index sits in a connection ID, and its size (big-endian).
pub const WORKER_OFFSET: usize = 0;
pub const WORKER_BYTES: usize = 2;

/// The most workers connection IDs can name.
pub const MAX_WORKERS: usize = 1 << (8 * WORKER_BYTES);

/// A new connection ID for a connection of `worker`.
pub fn generate(worker: usize) -> [u8; CID_LEN] {
    assert!(
        worker < MAX_WORKERS,
        "worker index {worker} beyond what a connection ID names"
    );
    let mut cid = [0u8; CID_LEN];
    rand_bytes(&mut cid[WORKER_OFFSET + WORKER_BYTES..]).expect("BoringSSL's random generator");
    cid[WORKER_OFFSET..WORKER_OFFSET + WORKER_BYTES]
        .copy_from_slice(&(worker as u16).to_be_bytes());
    cid
}

/// Which of `workers` the reuseport program sends a packet with this destination
/// connection ID to: the index the ID names, reduced modulo the worker count (a client's
/// own random ID, on its first packets, thus lands on a worker at random, always the
/// same for the same ID). `None` for an ID too short to name one.
pub fn worker_of(dcid: &[u8], workers: usize) -> Option<usize> {
    let bytes = dcid.get(WORKER_OFFSET..WORKER_OFFSET + WORKER_BYTES)?;
    let named = u16::from_be_bytes([bytes[0], bytes[1]]) as usize;
    Some(named % workers.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_worker_and_is_otherwise_random() {
        for worker in [0, 1, 7, 255, 256, MAX_WORKERS - 1] {
            let cid = generate(worker);
            assert_eq!(worker_of(&cid, MAX_WORKERS), Some(worker));
            assert_eq!(worker_of(&cid, 3), Some(worker % 3));
        }
        let (a, b) = (generate(5), generate(5));
        assert_eq!(a[..WORKER_BYTES], b[..WORKER_BYTES]);
        assert_ne!(a[WORKER_BYTES..], b[WORKER_BYTES..], "the rest is random");
    }

    #[test]
    fn a_short_id_names_no_worker() {
        assert_eq!(worker_of(&[], 4), None);
        assert_eq!(worker_of(&[9], 4), None);
        assert_eq!(worker_of(&[0, 9], 4), Some(1));
    }

    #[test]
    #[should_panic(expected = "beyond what a connection ID names")]
    fn too_many_workers_are_refused() {
        generate(MAX_WORKERS);
    }
}
