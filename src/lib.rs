//! tlsterm: a TLS termination proxy whose handshakes never compute a private-key
//! operation inline: signatures are queued per worker and computed in multi-buffer
//! batches by `tlsterm-engine`.
//!
//! # Layout
//!
//! Modules in layers; a module uses the ones in the layers below it.
//!
//! | layer | module | what it owns |
//! |---|---|---|
//! | 0 | `config` | the TOML configuration, one file per section: types, defaults, validation with line numbers |
//! | 0 | `metrics` | the Prometheus registry and the admin listener (`/metrics`, `/healthz`); it knows no series and no type of the other modules: each registers its own (`offload/metrics.rs`, `tls/metrics.rs`, ...) |
//! | 0 | `seal` | the fleet key (`[session] fleet_key_file`) and the sealing (AES-256-GCM, the entry's name as associated data) of what a fleet shares through Redis; it counts the entries that do not open |
//! | 0 | `testing` | (unit tests only) what the tests of several modules share: a TLS handshake over a socket pair |
//! | 0 | `sys` | the safe wrappers around the BoringSSL and libc calls that need `unsafe` (the only module allowed it), and the listening sockets' options |
//! | 1 | `offload` | private-key operations: the per-worker queue, its flush policy, the signer it calls (the engine crate, or BoringSSL inline) |
//! | 1 | `session` | resumption: tickets and their keys, the session cache, Redis, 0-RTT anti-replay |
//! | 1 | `proxy` | backends, the PROXY protocol header, the byte relay, the built-in HTTP responder; for forwarded HTTP requests, each worker's keep-alive backend connections and the forwarding headers |
//! | 2 | `tls` | BoringSSL contexts: certificates, selection by SNI, per-name profiles, client certificates and CRLs, OCSP, ECH, the async private-key hook, the record of what a handshake negotiated and the reason code of one that failed |
//! | 3 | `acme` | certificates obtained and renewed from an ACME CA: orders, TLS-ALPN-01 and HTTP-01 answers, storage, a fleet's shared lock and certificates |
//! | 3 | `quic` | HTTP/3: a QUIC endpoint per worker and listener (quiche over the listener's TLS), connection IDs that name their worker, requests forwarded to the backends as HTTP/1.1 |
//! | 3 | `server` | listeners, workers, one connection's life (bytes relayed, or HTTP requests forwarded), reload and drain |
//! | 4 | `speed`, `stats`, `main.rs` | the commands: `tlsterm speed`, `tlsterm stats`; `main.rs` parses the command line |
//!
//! The multi-buffer RSA engine is its own crate (`crates/engine`), below all of these;
//! the load generator `tlsterm bench` is `crates/bench`.
//!
//! A module of a layer may also use one of its own layer when no loop results (`config`
//! uses `sys` to read CRLs and ECH keys). `tests/suite/layers.rs` reads this table and checks
//! every `crate::` path of `src/` against it.

#![deny(unsafe_code)]

#[cfg(feature = "acme")]
pub mod acme;
/// Without the `acme` feature: the same `Acme`, which obtains nothing and refuses `[acme]`.
#[cfg(not(feature = "acme"))]
#[path = "acme/off.rs"]
pub mod acme;
pub mod config;
pub mod metrics;
pub mod offload;
pub mod proxy;
#[cfg(feature = "http3")]
pub mod quic;
/// Without the `http3` feature: the same entry points, which refuse `quic = true`.
#[cfg(not(feature = "http3"))]
#[path = "quic/off.rs"]
pub mod quic;
pub mod seal;
pub mod server;
pub mod session;
pub mod speed;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
#[cfg(test)]
mod testing;
pub mod tls;
