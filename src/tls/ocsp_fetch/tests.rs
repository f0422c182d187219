//! Unit tests: OCSP fetching: scheduling, retries, answers that cannot be stapled.

use super::*;

fn settings() -> OcspConfig {
    OcspConfig {
        timeout: Duration::from_secs(10),
        min_refresh: Duration::from_secs(300),
        max_refresh: Duration::from_secs(3600),
        retry: Duration::from_secs(10),
    }
}

#[test]
fn refresh_halfway_within_bounds() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let hours = |h: u64| Duration::from_secs(h * 3600);
    let window = |this: SystemTime, next: Option<SystemTime>| Validity {
        this_update: this,
        next_update: next,
    };
    let s = settings();
    // Valid 40 minutes from now: refreshed after 20.
    let short = window(now, Some(now + Duration::from_secs(2400)));
    assert_eq!(refresh_delay(short, now, &s), Duration::from_secs(1200));
    // A week's validity: at most max_refresh.
    let long = window(now, Some(now + hours(168)));
    assert_eq!(refresh_delay(long, now, &s), s.max_refresh);
    // Already past halfway: no sooner than min_refresh.
    let old = window(now - hours(10), Some(now + hours(1)));
    assert_eq!(refresh_delay(old, now, &s), s.min_refresh);
    // No nextUpdate: treated as valid for max_refresh.
    let open = window(now, None);
    assert_eq!(refresh_delay(open, now, &s), s.max_refresh / 2);
}

#[test]
fn retries_double_up_to_min_refresh() {
    let s = settings();
    let delays: Vec<u64> = (1..=7)
        .map(|failures| retry_delay(failures, &s).as_secs())
        .collect();
    assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(retry_delay(u32::MAX, &s), s.min_refresh);
}
