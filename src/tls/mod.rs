//! TLS setup: BoringSSL contexts built from a listener's configuration.
//!
//! Each certificate gets its own `SslContext` carrying the listener's settings, the
//! certificate chain and an asynchronous private-key method (no private key is given to
//! BoringSSL: every signature goes through the offload layer). A base context creates the
//! connections; its certificate-selection callback looks at the ClientHello (SNI and the
//! client's signature algorithms) and switches the connection to the right certificate's
//! context — ECDSA when the client can verify it, RSA otherwise. It then applies the
//! per-name settings, a fetched OCSP staple, and the verdict of the 0-RTT anti-replay
//! check; that check may ask Redis, so the callback is BoringSSL's asynchronous one (the
//! handshake waits, the worker does not).

pub mod acme_challenge;
mod certificate;
pub mod compress;
mod connection_setup;
mod context;
pub mod crl;
pub mod early_data;
pub mod ech;
pub mod expiry;
mod key_share_hint;
mod keymethod;
pub mod metrics;
mod names;
mod negotiated;
pub mod ocsp;
pub mod ocsp_fetch;
mod profile;
mod select;
pub mod selfsigned;
mod server_tls;
mod tls13;

pub use certificate::CertifiedKey;
pub use early_data::early_data_outcome;
pub use ech::ech_outcome;
pub use key_share_hint::record as record_key_share;
pub use negotiated::Negotiated;
pub use profile::Profiles;
pub use server_tls::ServerTls;
