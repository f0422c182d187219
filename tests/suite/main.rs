//! tlsterm's integration tests, one module per subject, built as one test binary: the
//! support code in `common` and the generic code of tokio, hyper and BoringSSL's wrappers
//! are compiled and linked once instead of once per subject, which is most of the suite's
//! build time on a small machine. `cargo test --release --test suite relay::` runs one
//! subject; every test runs on 127.0.0.1 with real clients and ends by itself.
//!
//! Tests of different subjects run side by side in one process, so what a test observes
//! belongs to that test: a backend's counters come with the backend (see `common::echo`),
//! and ports are handed out once per process (`common::free_port`).

mod common;

mod abuse;
mod acme;
#[cfg(all(feature = "http3", feature = "bench"))]
mod bench_http3;
mod client_certificates;
mod config_reference;
mod early_data;
mod ech;
mod engine_e2e;
#[cfg(feature = "http3")]
mod http3;
mod http_mode;
mod in_process;
mod key_shares;
mod layers;
mod metrics;
mod modern_clients;
mod ocsp;
mod operator;
mod relay;
mod resumption;
mod serve;
mod server_names;
mod sslyze;
