//! Unit tests: parsing the exposition and drawing tables and histograms.

use super::snapshot::parse;
use super::*;

const SAMPLE: &str = "\
# TYPE tlsterm_handshakes_total counter
tlsterm_handshakes_total{kind=\"full\"} 10
# TYPE tlsterm_engine_info gauge
tlsterm_engine_info{kernel=\"avx2\",signing=\"batch\"} 1
# TYPE tlsterm_tls_groups_total counter
tlsterm_tls_groups_total{group=\"X25519MLKEM768\"} 7
# TYPE tlsterm_key_shares_total counter
tlsterm_key_shares_total{group=\"X25519MLKEM768\",path=\"batch\"} 5
# TYPE tlsterm_ech_total counter
tlsterm_ech_total{result=\"accepted\"} 3
# TYPE tlsterm_engine_batch_seconds histogram
tlsterm_engine_batch_seconds_bucket{le=\"0.001\"} 2
tlsterm_engine_batch_seconds_bucket{le=\"0.002\"} 6
tlsterm_engine_batch_seconds_bucket{le=\"+Inf\"} 6
tlsterm_engine_batch_seconds_sum 0.009
tlsterm_engine_batch_seconds_count 6
";

#[test]
fn certificates_by_expiry_with_their_renewal() {
    let snapshot = parse(
        "\
# TYPE tlsterm_certificate_expiry_seconds gauge
tlsterm_certificate_expiry_seconds{name=\"a.example\"} 1000000
tlsterm_certificate_expiry_seconds{name=\"b.example\"} 20000
# TYPE tlsterm_acme_next_renewal_seconds gauge
tlsterm_acme_next_renewal_seconds{key_type=\"ecdsa-p256\",name=\"b.example\"} 13600
",
    )
    .unwrap();
    let mut out = String::new();
    render_certificates(&mut out, &snapshot, 10000.0);
    let b = out.find("b.example").expect(&out);
    let a = out.find("a.example").expect(&out);
    assert!(b < a, "soonest first: {out}");
    assert!(
        out.contains("expires in        2h   (ecdsa-p256 renews in 1h)"),
        "{out}"
    );
    assert!(out.contains("expires in   11d 11h"), "{out}");
}

#[test]
fn renders_counts_averages_and_bars() {
    let snapshot = parse(SAMPLE).unwrap();
    let text = render(&snapshot, None);
    assert!(text.contains("kind=\"full\""), "{text}");
    assert!(
        text.contains("engine         kernel=\"avx2\",signing=\"batch\""),
        "{text}"
    );
    assert!(
        text.contains("key exchange   group=\"X25519MLKEM768\""),
        "{text}"
    );
    assert!(
        text.contains("key shares     group=\"X25519MLKEM768\",path=\"batch\""),
        "{text}"
    );
    assert!(
        text.contains("ech            result=\"accepted\""),
        "{text}"
    );
    assert!(
        text.contains("engine batch compute time: count 6, average 1.50ms"),
        "{text}"
    );
    assert!(
        text.contains(&format!("|{:<40}|", "@".repeat(40))),
        "{text}"
    );
}

#[test]
fn one_row_per_worker_in_worker_order() {
    let mut text = String::new();
    for worker in [10, 2] {
        let handshakes = 100 * worker;
        text.push_str(&format!(
            "tlsterm_worker_connections_accepted_total{{worker=\"{worker}\"}} 7\n\
             tlsterm_worker_connections_active{{worker=\"{worker}\"}} 3\n\
             tlsterm_worker_handshakes_total{{worker=\"{worker}\"}} {handshakes}\n\
             tlsterm_worker_engine_operations_total{{worker=\"{worker}\"}} 5\n\
             tlsterm_worker_cpu_seconds_total{{worker=\"{worker}\"}} 0.5\n"
        ));
    }
    let rendered = render(&parse(&text).unwrap(), None);
    let rows: Vec<Vec<&str>> = rendered
        .lines()
        .skip_while(|l| !l.starts_with("worker"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["2", "7", "3", "200", "5", "0.50", "400"],
        "{rendered}"
    );
    assert_eq!(
        rows[1],
        ["10", "7", "3", "1000", "5", "0.50", "2000"],
        "{rendered}"
    );
}

#[test]
fn watch_mode_shows_the_difference() {
    let earlier = parse(SAMPLE).unwrap();
    let later = parse(&SAMPLE.replace("} 10", "} 30")).unwrap();
    let text = render(&later, Some((&earlier, Duration::from_secs(2))));
    assert!(text.contains("10.0/s"), "{text}");
}

#[test]
fn watch_mode_after_a_server_restart_counts_from_zero() {
    let earlier = parse(SAMPLE).unwrap();
    // The server restarted: counters and the histogram start again from zero (one
    // bucket has since grown past its old count; the first is below its old one).
    let later = parse(
        "\
# TYPE tlsterm_handshakes_total counter
tlsterm_handshakes_total{kind=\"full\"} 4
# TYPE tlsterm_engine_batch_seconds histogram
tlsterm_engine_batch_seconds_bucket{le=\"0.001\"} 0
tlsterm_engine_batch_seconds_bucket{le=\"0.002\"} 7
tlsterm_engine_batch_seconds_bucket{le=\"+Inf\"} 8
tlsterm_engine_batch_seconds_sum 0.1
tlsterm_engine_batch_seconds_count 8
",
    )
    .unwrap();
    let view = later.since(&earlier);
    assert_eq!(view.value("tlsterm_handshakes_total", "kind=\"full\""), 4.0);
    let key = ("tlsterm_engine_batch_seconds".to_string(), String::new());
    assert_eq!(
        view.histograms[&key],
        vec![(0.001, 0.0), (0.002, 7.0), (f64::INFINITY, 8.0)]
    );
    assert_eq!(view.sums[&key], 0.1);
    assert_eq!(view.value("tlsterm_engine_batch_seconds_count", ""), 8.0);
    let text = render(&later, Some((&earlier, Duration::from_secs(2))));
    assert!(text.contains("2.0/s"), "{text}");
    assert!(
        text.contains("engine batch compute time: count 8, average 12.50ms"),
        "{text}"
    );
    assert!(!text.contains("-2") && !text.contains("-3.0/s"), "{text}");
}
