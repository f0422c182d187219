//! Moving plaintext between the client's TLS stream and a backend.

pub mod pool;
pub mod proxy_protocol;
pub mod relay;
