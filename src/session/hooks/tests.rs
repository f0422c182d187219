//! A session lookup's answered, miss, timeout and error paths, against the in-memory
//! shared store.

use std::time::Duration;

use zeroize::Zeroizing;

use super::*;
use crate::session::shared_store::fake::FakeStore;

fn lookup(store: &FakeStore, id: &[u8]) -> Option<Vec<u8>> {
    let pending = store.get(id).ok()?;
    let outcome = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(pending);
    shared_answer(outcome)
}

#[test]
fn a_stored_session_is_found_and_an_unknown_id_misses() {
    let store = FakeStore::default();
    let der = SessionDer::new(Zeroizing::new(b"session bytes".to_vec()));
    store.put(b"id-1", der, Duration::from_secs(60), Box::new(|_| {}));
    assert_eq!(
        lookup(&store, b"id-1").as_deref(),
        Some(&b"session bytes"[..])
    );
    assert_eq!(lookup(&store, b"id-2"), None);
}

#[test]
fn a_lookup_without_an_answer_is_a_miss() {
    for failure in [RedisReply::Timeout, RedisReply::Error] {
        let store = FakeStore::default();
        let der = SessionDer::new(Zeroizing::new(b"session bytes".to_vec()));
        store.put(b"id-1", der, Duration::from_secs(60), Box::new(|_| {}));
        store.fail_with(failure.clone());
        assert_eq!(lookup(&store, b"id-1"), None, "{failure:?}");
    }
}
