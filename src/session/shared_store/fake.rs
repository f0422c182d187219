//! An in-memory [`SharedSessionStore`] for the callers' tests: it keeps the contract
//! (one first claim per key) and can be told to fail every operation the way Redis can.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use super::{Claim, PendingClaim, PendingGet, RedisReply, SessionDer, SharedSessionStore};

#[derive(Default)]
pub(crate) struct FakeStore {
    sessions: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    claims: Mutex<HashSet<String>>,
    /// When set, what every operation answers instead of doing its work.
    failure: Mutex<Option<RedisReply<()>>>,
    /// Each background claim's key, in order.
    pub(crate) background_claims: Mutex<Vec<String>>,
}

impl FakeStore {
    /// From now on every operation answers `failure` (`Timeout`, `Error`; `Overload` is
    /// answered before the operation starts, as Redis's in-flight limit does).
    pub(crate) fn fail_with(&self, failure: RedisReply<()>) {
        *self.failure.lock().unwrap() = Some(failure);
    }

    fn failure<T>(&self) -> Option<RedisReply<T>> {
        self.failure
            .lock()
            .unwrap()
            .clone()
            .map(|f| f.map(|()| unreachable!("a failure")))
    }

    fn overloaded(&self) -> bool {
        matches!(*self.failure.lock().unwrap(), Some(RedisReply::Overload))
    }
}

impl SharedSessionStore for FakeStore {
    fn get(&self, id: &[u8]) -> Result<PendingGet, RedisReply<()>> {
        if self.overloaded() {
            return Err(RedisReply::Overload);
        }
        let answer = self
            .failure()
            .unwrap_or_else(|| RedisReply::Done(self.sessions.lock().unwrap().get(id).cloned()));
        Ok(Box::pin(async move { answer }))
    }

    fn put(
        &self,
        id: &[u8],
        der: SessionDer,
        _ttl: Duration,
        done: Box<dyn FnOnce(RedisReply<()>) + Send>,
    ) {
        if let Some(failure) = self.failure() {
            return done(failure);
        }
        self.sessions
            .lock()
            .unwrap()
            .insert(id.to_vec(), der.to_vec());
        done(RedisReply::Done(()));
    }

    fn claim(&self, key: String, _ttl: Duration) -> Result<PendingClaim, RedisReply<()>> {
        if self.overloaded() {
            return Err(RedisReply::Overload);
        }
        let answer = self.failure().unwrap_or_else(|| {
            let first = self.claims.lock().unwrap().insert(key);
            RedisReply::Done(if first { Claim::First } else { Claim::Taken })
        });
        Ok(Box::pin(async move { answer }))
    }

    fn claim_in_background(
        &self,
        key: String,
        _ttl: Duration,
        mut done: Box<dyn FnMut(RedisReply<()>) + Send>,
    ) {
        self.background_claims.lock().unwrap().push(key.clone());
        match self.failure() {
            Some(failure) => done(failure),
            None => {
                self.claims.lock().unwrap().insert(key);
                done(RedisReply::Done(()));
            }
        }
    }
}
