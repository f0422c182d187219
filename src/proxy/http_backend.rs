//! HTTP/1.1 to a listener's backends: one worker's keep-alive connections, per backend
//! pool, through hyper's HTTP/1 client, for requests that came as HTTP/3 or as HTTP/1.1 over
//! TLS (`mode = "http"`). A connection is borrowed for one request and its response, and
//! given back once the response body has been read whole.

use std::cell::RefCell;
use std::sync::Arc;

use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::pool::BackendPool;

/// A connection to a backend, borrowed for one request.
pub type Borrowed<B> = SendRequest<B>;

/// Why a request got no response from the backend.
#[derive(Debug)]
pub enum BackendError {
    Connect(super::pool::ConnectError),
    Http(hyper::Error),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Connect(err) => write!(f, "cannot connect to a backend: {err}"),
            BackendError::Http(err) => write!(f, "backend: {err}"),
        }
    }
}

/// One worker's idle backend connections, by pool, for request bodies of type `B`. Each
/// pool is held with its connections, so that its address is never another's; a pool no
/// one else holds any more (its listener was reloaded away) is dropped with them.
pub struct Backends<B> {
    idle: RefCell<Vec<IdleOfPool<B>>>,
}

/// A pool, and its connections waiting for a request.
type IdleOfPool<B> = (Arc<BackendPool>, Vec<Borrowed<B>>);

impl<B> Default for Backends<B> {
    fn default() -> Self {
        Backends {
            idle: RefCell::new(Vec::new()),
        }
    }
}

/// Idle connections kept per pool and worker.
const MAX_IDLE: usize = 64;

impl<B> Backends<B>
where
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Sends `request` on an idle connection of `pool`, or a new one; an idle connection
    /// the backend closed meanwhile is discarded and the request sent on another (hyper
    /// hands a request back that it did not start to send).
    pub async fn send(
        &self,
        pool: &Arc<BackendPool>,
        mut request: Request<B>,
    ) -> Result<(Response<Incoming>, Borrowed<B>), BackendError> {
        loop {
            let (mut sender, fresh) = match self.take_idle(pool) {
                Some(sender) => (sender, false),
                None => (connect(pool).await?, true),
            };
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut failed) => match failed.take_message() {
                    // Only an idle connection is tried again: a new one that fails before
                    // sending anything is the backend's answer.
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(BackendError::Http(failed.into_error())),
                },
            }
        }
    }

    /// Gives a connection back once its response has been read whole.
    pub fn give_back(&self, pool: &Arc<BackendPool>, sender: Borrowed<B>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        idle.retain(|(kept, _)| Arc::ptr_eq(kept, pool) || Arc::strong_count(kept) > 1);
        let at = match idle.iter().position(|(kept, _)| Arc::ptr_eq(kept, pool)) {
            Some(at) => at,
            None => {
                idle.push((pool.clone(), Vec::new()));
                idle.len() - 1
            }
        };
        let list = &mut idle[at].1;
        if list.len() < MAX_IDLE {
            list.push(sender);
        }
    }

    /// An idle connection ready for a request; one the backend closed is dropped, one not
    /// ready yet (its last response just read, its task not yet run) stays for later.
    fn take_idle(&self, pool: &Arc<BackendPool>) -> Option<Borrowed<B>> {
        let mut idle = self.idle.borrow_mut();
        let (_, list) = idle.iter_mut().find(|(kept, _)| Arc::ptr_eq(kept, pool))?;
        list.retain(|sender| !sender.is_closed());
        let ready = list.iter().rposition(SendRequest::is_ready)?;
        Some(list.swap_remove(ready))
    }
}

async fn connect<B>(pool: &Arc<BackendPool>) -> Result<Borrowed<B>, BackendError>
where
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (stream, _address) = pool.connect().await.map_err(BackendError::Connect)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(BackendError::Http)?;
    tokio::task::spawn_local(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "backend connection ended with an error");
        }
    });
    Ok(sender)
}
