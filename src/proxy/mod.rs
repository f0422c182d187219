//! Moving plaintext between the client's TLS stream and a backend (bytes relayed, or HTTP
//! requests forwarded over pooled connections), and the built-in backend itself.

pub mod builtin_backend;
pub mod client_cert;
pub mod forwarding;
pub mod http_backend;
pub mod metrics;
pub mod pool;
pub mod proxy_protocol;
pub mod relay;
pub mod request_log;
