//! Moving plaintext between the client's TLS stream and a backend, and the built-in
//! backend itself.

pub mod builtin_backend;
pub mod metrics;
pub mod pool;
pub mod proxy_protocol;
pub mod relay;
