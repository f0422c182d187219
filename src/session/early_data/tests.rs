//! The 0-RTT claim's answered, timeout, error and overload paths, against the in-memory
//! shared store.

use std::future::Future;
use std::sync::Arc;

use super::*;
use crate::session::shared_store::fake::FakeStore;

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

fn verdict(store: &Arc<FakeStore>, key: &str) -> Verdict {
    block_on(claim_shared(store.clone(), key.to_string()).verdict())
}

#[test]
fn the_first_claim_of_a_hello_accepts_it_and_every_copy_is_a_replay() {
    let store = Arc::new(FakeStore::default());
    assert_eq!(verdict(&store, "0rtt:aa"), Verdict::Fresh);
    assert_eq!(verdict(&store, "0rtt:aa"), Verdict::Replayed);
    assert_eq!(verdict(&store, "0rtt:bb"), Verdict::Fresh, "another hello");
    assert!(store.background_claims.lock().unwrap().is_empty());
}

#[test]
fn a_claim_without_an_answer_refuses_and_is_claimed_again_in_the_background() {
    for failure in [RedisReply::Timeout, RedisReply::Error] {
        let store = Arc::new(FakeStore::default());
        store.fail_with(failure.clone());
        assert_eq!(
            verdict(&store, "0rtt:cc"),
            Verdict::Unchecked,
            "{failure:?}"
        );
        assert_eq!(*store.background_claims.lock().unwrap(), ["0rtt:cc"]);
    }
}

#[test]
fn a_claim_that_cannot_be_sent_refuses_at_once() {
    let store = Arc::new(FakeStore::default());
    store.fail_with(RedisReply::Overload);
    let check = claim_shared(store.clone(), "0rtt:dd".to_string());
    assert!(matches!(check, EarlyDataCheck::Now(Verdict::Unchecked)));
    assert_eq!(*store.background_claims.lock().unwrap(), ["0rtt:dd"]);
}

#[test]
fn a_hello_claimed_in_the_background_is_a_replay_everywhere_after() {
    let store = Arc::new(FakeStore::default());
    claim_in_background(&*store, "0rtt:ee".to_string());
    assert_eq!(verdict(&store, "0rtt:ee"), Verdict::Replayed);
}
