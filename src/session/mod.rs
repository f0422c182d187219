//! Session resumption: ticket keys shared by all workers (from a file or rotated in
//! memory), a bounded session-ID cache, and a Redis-backed distributed cache.
//! (This is the hook the TLS setup calls.)
//!
//! Files: `handle` (the [`Sessions`] handle and what `[session]` asks of it), `hooks`
//! (installed on BoringSSL: store, lookup, ticket keys), `early_data` (0-RTT anti-replay
//! check), `metrics`, and the parts: `tickets`, `cache`, `redis`, `replay`;
//! `shared_store` is the contract Redis keeps for the callers (`SharedSessionStore`).
//!
//! All of it lives in one [`Sessions`] per process, created before the workers start and
//! kept across reloads, so that a SIGHUP (which builds new TLS contexts) does not turn the
//! next connections into full handshakes.
//!
//! * Tickets (TLS 1.2 and 1.3): BoringSSL asks the ticket key hook (`hooks`) to pick the key that
//!   encrypts a new ticket and to find the one that decrypts a presented ticket. Keys are in a
//!   ring published through an `ArcSwap` (see `tickets`): no lock on the handshake path.
//! * Session IDs (TLS 1.2, when the client does not use tickets): the base context's external
//!   cache callbacks store serialized sessions in an in-process LRU cache (`cache`) and, when
//!   configured, in Redis (`redis`). Lookups go through BoringSSL's asynchronous get-session
//!   callback: the handshake is suspended while Redis answers, the worker is not.

mod cache;
mod early_data;
mod handle;
mod hooks;
mod metrics;
pub mod redis;
mod redis_client;
pub mod replay;
pub mod shared_store;
pub mod ticket_key;
pub mod tickets;

pub use early_data::EarlyDataCheck;
pub use handle::Sessions;
