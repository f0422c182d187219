//! Counters, latency histograms and the final report.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Counters shared by all worker threads, read by the progress line.
#[derive(Default)]
pub struct Live {
    pub handshakes: AtomicU64,
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub resumed: AtomicU64,
}

impl Live {
    pub fn snapshot(&self) -> [u64; 5] {
        [
            self.handshakes.load(Relaxed),
            self.requests.load(Relaxed),
            self.bytes.load(Relaxed),
            self.errors.load(Relaxed),
            self.resumed.load(Relaxed),
        ]
    }
}

/// The longest latency the histograms hold, in microseconds (100 s).
pub const LATENCY_BOUND_US: u64 = 100_000_000;

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 us .. 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, LATENCY_BOUND_US, 3).expect("valid histogram bounds")
}

/// Which latency histogram of [`Stats`] a sample goes to.
#[derive(Clone, Copy, Debug)]
pub enum Hist {
    Handshake,
    Request,
    Total,
    StartLag,
}

/// What one worker thread measured.
pub struct Stats {
    /// TCP connect + TLS handshake, per connection (open loop: from the scheduled time).
    pub handshake: Histogram<u64>,
    /// Request written until its response was read completely.
    pub request: Histogram<u64>,
    /// A whole unit of work (connect + handshake + request, or one keep-alive request);
    /// in open-loop mode measured from the scheduled start.
    pub total: Histogram<u64>,
    /// Open loop only: how late units started after their scheduled time (timer
    /// granularity, and waiting for a free connection slot when all are busy).
    pub start_lag: Histogram<u64>,
    pub handshakes: u64,
    pub resumed: u64,
    /// Resumed connections whose request the server accepted as 0-RTT early data.
    pub early_data_accepted: u64,
    /// Handshakes whose Encrypted Client Hello the server accepted.
    pub ech_accepted: u64,
    pub requests: u64,
    pub body_bytes: u64,
    pub wire_bytes: u64,
    pub errors: BTreeMap<String, u64>,
    pub status: BTreeMap<u16, u64>,
    /// Negotiated protocol/cipher seen, with counts.
    pub negotiated: BTreeMap<String, u64>,
    /// Latency samples longer than the histograms hold, recorded as the bound: when
    /// non-zero, the high percentiles and the maximum read low.
    pub clamped: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            handshake: histogram(),
            request: histogram(),
            total: histogram(),
            start_lag: histogram(),
            handshakes: 0,
            resumed: 0,
            early_data_accepted: 0,
            ech_accepted: 0,
            requests: 0,
            body_bytes: 0,
            wire_bytes: 0,
            errors: BTreeMap::new(),
            status: BTreeMap::new(),
            negotiated: BTreeMap::new(),
            clamped: 0,
        }
    }
}

pub fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

impl Stats {
    /// Record a latency in microseconds. One longer than the histogram holds (an
    /// overloaded server in a long run) is kept at the bound and counted, not dropped:
    /// dropping it would make the tail read better than it was.
    pub fn record(&mut self, which: Hist, us: u64) {
        let h = match which {
            Hist::Handshake => &mut self.handshake,
            Hist::Request => &mut self.request,
            Hist::Total => &mut self.total,
            Hist::StartLag => &mut self.start_lag,
        };
        if us > h.high() {
            self.clamped += 1;
        }
        h.saturating_record(us);
    }

    pub fn error(&mut self, kind: &str) {
        *self.errors.entry(kind.to_string()).or_default() += 1;
    }

    pub fn merge(&mut self, o: Stats) {
        self.handshake.add(&o.handshake).expect("same bounds");
        self.request.add(&o.request).expect("same bounds");
        self.total.add(&o.total).expect("same bounds");
        self.start_lag.add(&o.start_lag).expect("same bounds");
        self.handshakes += o.handshakes;
        self.resumed += o.resumed;
        self.early_data_accepted += o.early_data_accepted;
        self.ech_accepted += o.ech_accepted;
        self.requests += o.requests;
        self.body_bytes += o.body_bytes;
        self.wire_bytes += o.wire_bytes;
        self.clamped += o.clamped;
        for (k, v) in o.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in o.status {
            *self.status.entry(k).or_default() += v;
        }
        for (k, v) in o.negotiated {
            *self.negotiated.entry(k).or_default() += v;
        }
    }
}

/// Latency summary in microseconds.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Latency {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// (quantile, microseconds) points for a CDF chart.
    pub cdf: Vec<(f64, u64)>,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        let mut cdf = Vec::new();
        if !h.is_empty() {
            // Even steps up to p99, then finer steps through the tail.
            let mut q: Vec<f64> = (0..99).map(|i| i as f64 / 100.0).collect();
            q.extend((0..9).map(|i| 0.99 + i as f64 / 1000.0));
            q.extend((0..10).map(|i| 0.999 + i as f64 / 10_000.0));
            q.push(1.0);
            for q in q {
                cdf.push((q, h.value_at_quantile(q)));
            }
        }
        Latency {
            count: h.len(),
            mean_us: h.mean(),
            p50_us: h.value_at_quantile(0.50),
            p90_us: h.value_at_quantile(0.90),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            cdf,
        }
    }
}

/// The final result of one `tlsterm bench` run (the `--json` output).
#[derive(Serialize, Debug, Default)]
pub struct Report {
    pub url: String,
    pub mode: String,
    /// HTTP/3 over QUIC (`--http3`) rather than HTTP/1.1 over TLS.
    pub http3: bool,
    pub concurrency: usize,
    pub threads: usize,
    /// Target rate for open-loop runs (units of work per second).
    pub rate: Option<f64>,
    pub elapsed_s: f64,
    pub handshakes: u64,
    pub resumed: u64,
    pub early_data_accepted: u64,
    /// Handshakes whose Encrypted Client Hello the server accepted.
    pub ech_accepted: u64,
    pub requests: u64,
    pub body_bytes: u64,
    pub wire_bytes: u64,
    pub handshakes_per_s: f64,
    pub requests_per_s: f64,
    /// Response bytes (headers + body) per second, in MB/s (10^6).
    pub mb_per_s: f64,
    pub errors_total: u64,
    pub errors: BTreeMap<String, u64>,
    pub status: BTreeMap<u16, u64>,
    pub negotiated: BTreeMap<String, u64>,
    /// Server certificates that arrived compressed, by algorithm (the others came plain:
    /// none offered, or a resumed handshake, which sends no certificate).
    pub certificates_compressed: BTreeMap<String, u64>,
    pub handshake_latency: Latency,
    pub request_latency: Latency,
    pub total_latency: Latency,
    pub start_lag: Latency,
    /// Latency samples above the histograms' bound (100 s), recorded as 100 s: when
    /// non-zero, p99, p99.9 and max are at least this long but read as the bound.
    pub latencies_clamped: u64,
    /// The client's own CPU time (getrusage, user + system) during the run.
    pub client_cpu_s: f64,
    /// client_cpu_s / elapsed_s / threads: near 1.0 means the client was the bottleneck.
    pub client_cpu_util: f64,
    pub handshakes_per_client_cpu_s: f64,
}

/// User + system CPU seconds of this process so far.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn fmt_us(us: u64) -> String {
    if us >= 10_000_000 {
        format!("{:.1}s", us as f64 / 1e6)
    } else if us >= 10_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else if us >= 1_000 {
        format!("{:.2}ms", us as f64 / 1e3)
    } else {
        format!("{us}us")
    }
}

impl Report {
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let rate = self
            .rate
            .map(|r| format!(", open loop at {r}/s"))
            .unwrap_or_default();
        let over = if self.http3 {
            " (HTTP/3 over QUIC)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "{} mode{over}, {} connections, {} thread(s){rate}, {:.2}s",
            self.mode, self.concurrency, self.threads, self.elapsed_s
        );
        let _ = writeln!(
            s,
            "  handshakes: {} ({:.1}/s), resumed: {}, 0-RTT accepted: {}",
            self.handshakes, self.handshakes_per_s, self.resumed, self.early_data_accepted
        );
        let _ = writeln!(
            s,
            "  requests:   {} ({:.1}/s), {:.2} MB/s ({} body bytes)",
            self.requests, self.requests_per_s, self.mb_per_s, self.body_bytes
        );
        for (k, v) in &self.negotiated {
            let _ = writeln!(s, "  negotiated: {k} x{v}");
        }
        if self.ech_accepted > 0 {
            let _ = writeln!(
                s,
                "  encrypted client hello accepted: {}",
                self.ech_accepted
            );
        }
        if !self.certificates_compressed.is_empty() {
            let by: Vec<String> = self
                .certificates_compressed
                .iter()
                .map(|(k, v)| format!("{k} x{v}"))
                .collect();
            let full = self.handshakes - self.resumed;
            let _ = writeln!(
                s,
                "  certificates compressed: {} (of {full} full handshakes)",
                by.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "  latency        p50       p90       p99     p99.9       max      mean"
        );
        for (name, l) in [
            ("handshake", &self.handshake_latency),
            ("request", &self.request_latency),
            ("total", &self.total_latency),
            ("start lag", &self.start_lag),
        ] {
            if l.count == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "  {name:<10}{:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                fmt_us(l.p50_us),
                fmt_us(l.p90_us),
                fmt_us(l.p99_us),
                fmt_us(l.p999_us),
                fmt_us(l.max_us),
                fmt_us(l.mean_us as u64)
            );
        }
        if self.latencies_clamped > 0 {
            let _ = writeln!(
                s,
                "  latencies over {bound}: {} (recorded as {bound}; p99, p99.9 and max read low)",
                self.latencies_clamped,
                bound = fmt_us(LATENCY_BOUND_US)
            );
        }
        let _ = writeln!(s, "  errors: {}", self.errors_total);
        for (k, v) in &self.errors {
            let _ = writeln!(s, "    {k}: {v}");
        }
        let non_ok: Vec<String> = self
            .status
            .iter()
            .filter(|(k, _)| !(200..300).contains(*k))
            .map(|(k, v)| format!("{k} x{v}"))
            .collect();
        if !non_ok.is_empty() {
            let _ = writeln!(s, "  non-2xx responses: {}", non_ok.join(", "));
        }
        let _ = writeln!(
            s,
            "  client: {:.2} CPU-s ({:.0}% of {} core(s)), {:.0} handshakes per client CPU-second{}",
            self.client_cpu_s,
            self.client_cpu_util * 100.0,
            self.threads,
            self.handshakes_per_client_cpu_s,
            if self.client_cpu_util > 0.9 {
                "  [client-bound: the load generator was saturated]"
            } else {
                ""
            }
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_past_the_bound_are_kept_and_counted() {
        let mut stats = Stats::default();
        stats.record(Hist::Total, 1_000);
        stats.record(Hist::Total, 500 * 1_000_000);
        stats.record(Hist::Request, 200 * 1_000_000);
        assert_eq!(stats.total.len(), 2, "the long sample is not dropped");
        assert_eq!(stats.clamped, 2);
        let total = Latency::of(&stats.total);
        assert!(total.max_us >= LATENCY_BOUND_US, "{total:?}");
        let mut other = Stats::default();
        other.record(Hist::Handshake, LATENCY_BOUND_US + 1);
        stats.merge(other);
        assert_eq!(stats.clamped, 3);

        let report = Report {
            latencies_clamped: stats.clamped,
            ..Report::default()
        };
        assert!(
            report.text().contains("latencies over 100.0s: 3"),
            "{}",
            report.text()
        );
        assert!(!Report::default().text().contains("latencies over"));
    }
}
