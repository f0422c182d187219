//! One scrape of the admin listener's `/metrics`, reduced to what `tlsterm stats` draws,
//! and the difference of two scrapes (what happened in between, for `--watch`).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use prometheus_parse::{Scrape, Value};

/// One scrape, reduced to what is rendered.
#[derive(Default, Clone)]
pub(super) struct Snapshot {
    /// (metric, label text) -> value, for counters and gauges.
    pub(super) values: BTreeMap<(String, String), f64>,
    /// (metric, label text) -> cumulative buckets (upper bound, count).
    pub(super) histograms: BTreeMap<(String, String), Vec<(f64, f64)>>,
    pub(super) sums: BTreeMap<(String, String), f64>,
}

fn label_text(labels: &prometheus_parse::Labels) -> String {
    let text = labels.to_string();
    text.trim_matches(|c| c == '{' || c == '}').to_string()
}

pub(super) fn fetch(admin: SocketAddr) -> anyhow::Result<Snapshot> {
    let body = ureq::get(&format!("http://{admin}/metrics"))
        .call()
        .map_err(|e| anyhow::anyhow!("cannot read http://{admin}/metrics: {e}"))?
        .body_mut()
        .read_to_string()?;
    parse(&body)
}

pub(super) fn parse(body: &str) -> anyhow::Result<Snapshot> {
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string())))?;
    let mut snapshot = Snapshot::default();
    for sample in scrape.samples {
        let key = (sample.metric.clone(), label_text(&sample.labels));
        match sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => {
                if let Some(name) = sample.metric.strip_suffix("_sum") {
                    snapshot.sums.insert((name.to_string(), key.1.clone()), v);
                }
                snapshot.values.insert(key, v);
            }
            Value::Histogram(buckets) => {
                let buckets = buckets.iter().map(|b| (b.less_than, b.count)).collect();
                snapshot.histograms.insert(key, buckets);
            }
            Value::Summary(_) => {}
        }
    }
    Ok(snapshot)
}

/// What a counter counted between two scrapes. A counter below its earlier value has
/// restarted from zero (the server restarted): what it counts now all happened since.
fn counted(now: f64, then: f64) -> f64 {
    if now < then {
        now
    } else {
        now - then
    }
}

impl Snapshot {
    /// What happened between `earlier` and `self`. Series that went down have been
    /// reset by a server restart in between, and count from zero.
    pub(super) fn since(&self, earlier: &Snapshot) -> Snapshot {
        let diff = |now: &BTreeMap<(String, String), f64>,
                    then: &BTreeMap<(String, String), f64>,
                    reset: &dyn Fn(&(String, String)) -> bool| {
            now.iter()
                .map(|(k, &v)| {
                    let before = then.get(k).copied().unwrap_or(0.0);
                    let d = if reset(k) { v } else { counted(v, before) };
                    (k.clone(), d)
                })
                .collect()
        };
        // A histogram is reset as a whole when any of its buckets went down (after a
        // restart, some buckets can by chance have grown past their old counts); its
        // sum goes with it.
        let reset_histograms: std::collections::BTreeSet<&(String, String)> = self
            .histograms
            .iter()
            .filter(|(k, buckets)| {
                earlier.histograms.get(*k).is_some_and(|before| {
                    buckets
                        .iter()
                        .zip(before)
                        .any(|(&(_, now), &(_, then))| now < then)
                })
            })
            .map(|(k, _)| k)
            .collect();
        Snapshot {
            values: diff(&self.values, &earlier.values, &|(metric, labels)| {
                // A reset histogram's `_count` and `_sum` go with it.
                ["_count", "_sum"].iter().any(|suffix| {
                    metric.strip_suffix(suffix).is_some_and(|base| {
                        reset_histograms.contains(&(base.to_string(), labels.clone()))
                    })
                })
            }),
            sums: diff(&self.sums, &earlier.sums, &|k| reset_histograms.contains(k)),
            histograms: self
                .histograms
                .iter()
                .map(|(k, buckets)| {
                    let before = earlier
                        .histograms
                        .get(k)
                        .filter(|_| !reset_histograms.contains(k));
                    let diffed = buckets
                        .iter()
                        .enumerate()
                        .map(|(i, &(le, c))| {
                            (le, c - before.and_then(|b| b.get(i)).map_or(0.0, |b| b.1))
                        })
                        .collect();
                    (k.clone(), diffed)
                })
                .collect(),
        }
    }

    pub(super) fn value(&self, metric: &str, labels: &str) -> f64 {
        self.values
            .get(&(metric.to_string(), labels.to_string()))
            .copied()
            .unwrap_or(0.0)
    }

    /// Values of one metric by label text.
    pub(super) fn series(&self, metric: &str) -> Vec<(String, f64)> {
        self.values
            .iter()
            .filter(|((m, _), _)| m == metric)
            .map(|((_, l), v)| (l.clone(), *v))
            .collect()
    }
}
