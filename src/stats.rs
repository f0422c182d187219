//! `tlsterm stats`: the admin listener's metrics as terminal tables and histograms, the
//! way a bpftrace latency script shows handshake and crypto latency, built in.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod snapshot;

use snapshot::{fetch, Snapshot};

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// Admin listener of the running `tlsterm serve`.
    #[arg(long, default_value_t = crate::config::default_admin_address())]
    pub admin: SocketAddr,
    /// Refresh continuously, showing rates and histograms of the last interval.
    #[arg(long)]
    pub watch: bool,
    /// Refresh interval in watch mode, e.g. 1s, 500ms.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
}

fn format_seconds(s: f64) -> String {
    match s {
        s if s < 1e-3 => format!("{:.0}us", s * 1e6),
        s if s < 1.0 => format!("{:.2}ms", s * 1e3),
        s => format!("{s:.2}s"),
    }
}

/// A bpftrace-style histogram: one row per non-empty bucket.
fn render_histogram(
    out: &mut String,
    title: &str,
    buckets: &[(f64, f64)],
    sum: Option<f64>,
    seconds: bool,
) {
    let total = buckets.last().map_or(0.0, |b| b.1);
    let average = match (sum, total > 0.0) {
        (Some(sum), true) => {
            let avg = sum / total;
            if seconds {
                format_seconds(avg)
            } else {
                format!("{avg:.2}")
            }
        }
        _ => "-".into(),
    };
    out.push_str(&format!("\n{title}: count {total:.0}, average {average}\n"));
    let mut previous = (0.0, 0.0);
    let rows: Vec<(String, f64)> = buckets
        .iter()
        .map(|&(le, cumulative)| {
            let count = cumulative - previous.1;
            let label = if seconds {
                let hi = if le.is_infinite() {
                    "inf".into()
                } else {
                    format_seconds(le)
                };
                format!("[{}, {hi})", format_seconds(previous.0))
            } else if le.is_infinite() {
                format!("> {}", previous.0)
            } else {
                format!("{le}")
            };
            previous = (le, cumulative);
            (label, count)
        })
        .collect();
    let max = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    let first = rows.iter().position(|r| r.1 > 0.0);
    let last = rows.iter().rposition(|r| r.1 > 0.0);
    let (Some(first), Some(last)) = (first, last) else {
        out.push_str("  (no samples)\n");
        return;
    };
    for (label, count) in &rows[first..=last] {
        let width = if max > 0.0 {
            (count / max * 40.0).round() as usize
        } else {
            0
        };
        out.push_str(&format!(
            "  {label:>20} {count:>9.0} |{:<40}|\n",
            "@".repeat(width)
        ));
    }
}

/// The screen `tlsterm stats` prints. Over 80 lines on purpose: its sections in the order
/// shown, each a few lines of formatting, so the code reads like the output.
fn render(now: &Snapshot, window: Option<(&Snapshot, Duration)>) -> String {
    let (view, seconds) = match window {
        Some((earlier, elapsed)) => (now.since(earlier), Some(elapsed.as_secs_f64())),
        None => (now.clone(), None),
    };
    let mut out = String::new();
    let rate = |count: f64| match seconds {
        Some(s) if s > 0.0 => format!("{count:>10.0}  {:>10.1}/s", count / s),
        _ => format!("{count:>10.0}"),
    };
    let scope = if seconds.is_some() {
        "last interval"
    } else {
        "since start"
    };
    out.push_str(&format!("tlsterm stats ({scope})\n\n"));
    // Which kernel signs, and whether RSA signatures are batched or inline.
    for (labels, value) in now.series("tlsterm_engine_info") {
        if value == 1.0 {
            out.push_str(&format!("engine         {labels}\n\n"));
        }
    }
    out.push_str(&format!(
        "connections    accepted {}   active now {:.0}   to backends, pooled {:.0}\n",
        rate(view.value("tlsterm_connections_accepted_total", "")),
        now.value("tlsterm_connections_active", ""),
        now.value("tlsterm_backend_pooled_connections", "")
    ));
    // Counters by label set: (metric, title, width of the label column).
    let counters = [
        ("tlsterm_handshakes_total", "handshakes", 22),
        ("tlsterm_handshake_failures_total", "failed", 22),
        ("tlsterm_listener_handshakes_total", "handshakes", 32),
        ("tlsterm_listener_handshake_failures_total", "failed", 32),
        ("tlsterm_engine_operations_total", "engine ops", 40),
        ("tlsterm_engine_flushes_total", "batch flushes", 22),
        ("tlsterm_tls_versions_total", "version", 22),
        ("tlsterm_tls_groups_total", "key exchange", 22),
        ("tlsterm_key_shares_total", "key shares", 40),
        (
            "tlsterm_engine_key_share_flushes_total",
            "share flushes",
            22,
        ),
        ("tlsterm_certificates_compressed_total", "compressed", 22),
        ("tlsterm_ech_total", "ech", 22),
        ("tlsterm_early_data_total", "0-rtt", 22),
        ("tlsterm_ocsp_responses_total", "ocsp", 22),
        ("tlsterm_acme_orders_total", "acme orders", 22),
        (
            "tlsterm_acme_certificates_installed_total",
            "acme installed",
            22,
        ),
        ("tlsterm_bytes_total", "bytes", 22),
        ("tlsterm_http_requests_total", "http requests", 32),
        ("tlsterm_http_parked_total", "http parked", 22),
        ("tlsterm_http_early_data_requests_total", "http 0-rtt", 22),
        ("tlsterm_http_too_early_retries_total", "http 425 again", 22),
        (
            "tlsterm_backend_connection_waits_total",
            "backend waits",
            22,
        ),
        ("tlsterm_quic_connections_total", "quic conns", 22),
        ("tlsterm_quic_handshakes_total", "quic handshake", 22),
        ("tlsterm_quic_streams_total", "quic requests", 22),
        ("tlsterm_quic_packets_dropped_total", "quic dropped", 22),
        ("tlsterm_quic_retries_total", "quic retry", 22),
        ("tlsterm_quic_tokens_refused_total", "quic token", 22),
        ("tlsterm_quic_backend_errors_total", "quic backend", 22),
    ];
    for (metric, title, width) in counters {
        for (labels, count) in view.series(metric) {
            out.push_str(&format!("{title:<15}{labels:<width$} {}\n", rate(count)));
        }
    }
    render_workers(&mut out, &view, now);
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    render_certificates(&mut out, now, unix_now);

    let histograms: [(&str, &str, &str, bool); 7] = [
        (
            "handshake total (accept to done)",
            "tlsterm_handshake_seconds",
            "phase=\"total\"",
            true,
        ),
        (
            "handshake inside BoringSSL",
            "tlsterm_handshake_seconds",
            "phase=\"tls\"",
            true,
        ),
        (
            "handshake waiting on the private-key engine",
            "tlsterm_handshake_seconds",
            "phase=\"engine_wait\"",
            true,
        ),
        (
            "engine queue wait",
            "tlsterm_engine_queue_wait_seconds",
            "",
            true,
        ),
        (
            "engine batch compute time",
            "tlsterm_engine_batch_seconds",
            "",
            true,
        ),
        (
            "operations per batch",
            "tlsterm_engine_batch_operations",
            "",
            false,
        ),
        (
            "backend connect time",
            "tlsterm_backend_connect_seconds",
            "",
            true,
        ),
    ];
    for (title, metric, labels, seconds) in histograms {
        let key = (metric.to_string(), labels.to_string());
        if let Some(buckets) = view.histograms.get(&key) {
            render_histogram(
                &mut out,
                title,
                buckets,
                view.sums.get(&key).copied(),
                seconds,
            );
        }
    }
    out
}

/// How long until `at` (Unix seconds), in days and hours.
fn format_until(at: f64, now: f64) -> String {
    let left = at - now;
    let (sign, left) = if left < 0.0 { ("-", -left) } else { ("", left) };
    let hours = (left / 3600.0) as u64;
    match hours {
        0 => format!("{sign}{:.0}s", left),
        h if h < 48 => format!("{sign}{h}h"),
        h => format!("{sign}{}d {}h", h / 24, h % 24),
    }
}

/// One row per served name: when its certificate expires and, for ACME certificates,
/// when it is renewed next.
fn render_certificates(out: &mut String, now: &Snapshot, unix_now: f64) {
    let mut expiry = now.series("tlsterm_certificate_expiry_seconds");
    if expiry.is_empty() {
        return;
    }
    expiry.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    let renewals = now.series("tlsterm_acme_next_renewal_seconds");
    out.push_str("\ncertificates (soonest expiry first)\n");
    for (labels, at) in expiry {
        let name = labels
            .strip_prefix("name=\"")
            .and_then(|l| l.strip_suffix('"'))
            .unwrap_or(&labels);
        let mut line = format!("  {name:<40} expires in {:>9}", format_until(at, unix_now));
        let renew: Vec<String> = renewals
            .iter()
            .filter(|(l, _)| l.contains(&format!("name=\"{name}\"")))
            .map(|(l, at)| {
                let key = l
                    .split("key_type=\"")
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or("");
                format!("{key} renews in {}", format_until(*at, unix_now))
            })
            .collect();
        if !renew.is_empty() {
            line.push_str(&format!("   ({})", renew.join(", ")));
        }
        out.push_str(&line);
        out.push('\n');
    }
}

/// One row per worker: how the kernel spread the connections, and each core's handshakes
/// per CPU-second (counts are of `view`, the open connections of `now`).
fn render_workers(out: &mut String, view: &Snapshot, now: &Snapshot) {
    let mut workers: Vec<(usize, String)> = view
        .series("tlsterm_worker_connections_accepted_total")
        .into_iter()
        .filter_map(|(labels, _)| {
            let index = labels.strip_prefix("worker=\"")?.strip_suffix('"')?;
            Some((index.parse().ok()?, labels))
        })
        .collect();
    if workers.is_empty() {
        return;
    }
    workers.sort();
    out.push_str(&format!(
        "\n{:<8}{:>12}{:>8}{:>12}{:>12}{:>10}{:>18}\n",
        "worker", "accepted", "open", "handshakes", "engine ops", "cpu s", "handshakes/cpu-s"
    ));
    for (index, labels) in workers {
        let value = |metric: &str| view.value(metric, &labels);
        let handshakes = value("tlsterm_worker_handshakes_total");
        let cpu = value("tlsterm_worker_cpu_seconds_total");
        let per_cpu = if cpu > 0.0 {
            format!("{:.0}", handshakes / cpu)
        } else {
            "-".to_string()
        };
        out.push_str(&format!(
            "{index:<8}{:>12.0}{:>8.0}{handshakes:>12.0}{:>12.0}{cpu:>10.2}{per_cpu:>18}\n",
            value("tlsterm_worker_connections_accepted_total"),
            now.value("tlsterm_worker_connections_active", &labels),
            value("tlsterm_worker_engine_operations_total"),
        ));
    }
}

pub fn run(args: &StatsArgs) -> anyhow::Result<()> {
    let mut previous = fetch(args.admin)?;
    if !args.watch {
        print!("{}", render(&previous, None));
        return Ok(());
    }
    let mut taken = Instant::now();
    loop {
        std::thread::sleep(args.interval);
        let current = fetch(args.admin)?;
        let now = Instant::now();
        // Clear the screen and draw from the top, like `watch`.
        print!(
            "\x1b[2J\x1b[H{}",
            render(&current, Some((&previous, now - taken)))
        );
        previous = current;
        taken = now;
    }
}

#[cfg(test)]
mod tests;
