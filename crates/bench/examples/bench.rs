//! Run the load generator without the root binary: `cargo run --release -p tlsterm-bench --example bench -- URL ...`.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tlsterm_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    tlsterm_bench::run(&Cli::parse().args)
}
