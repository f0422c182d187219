//! tlsterm: a TLS termination proxy whose handshakes never compute a private-key
//! operation inline: signatures are queued per worker and computed in multi-buffer
//! batches by `tlsterm-engine`.
//!
//! Layout: `config` (TOML), `tls` (BoringSSL contexts, certificate selection, the async
//! private-key hook), `offload` (per-worker queue and flush policy in front of the
//! engine), `proxy` (backends, PROXY protocol, relay), `server` (workers, reload,
//! shutdown), `backend` (built-in HTTP responder), `metrics`, `speed`.

pub mod backend;
pub mod config;
pub mod metrics;
pub mod offload;
pub mod proxy;
pub mod server;
pub mod session;
pub mod speed;
pub mod stats;
pub mod tls;
