//! Latency histograms small enough for shared memory, and the Prometheus text format that
//! exposes them.
//!
//! # Histogram
//!
//! A [`Histogram`] counts microsecond values in log-linear buckets, as HdrHistogram does: values
//! below 32 each have their own bucket, and each power of two above is split into 16 equal
//! sub-buckets.
//!
//! ```text
//! values (µs)              bucket width   buckets
//! 0 ..= 15                       1           16   exact
//! 16 ..= 31                      1           16   exact
//! 32 ..= 63                      2           16
//! 64 ..= 127                     4           16
//! ...
//! 2^k ..= 2^(k+1) - 1        2^(k-4)         16
//! ...
//! 2^39 ..= 2^40 - 1           2^35           16   the last one also holds every value >= 2^40
//! ```
//!
//! That is [`BUCKETS`] = 592 counters (4.7 KB) for 0 to 2^40 µs (about 12.7 days). A value `v` in
//! `[2^k, 2^(k+1))` is reported as its bucket's upper bound, which overstates it by at most
//! `(2^(k-4) - 1) / 2^k` of `v`: always less than 1/16 (6.25 %), and 0 below 32 µs. Values from
//! 2^40 µs on are counted in the top bucket and in [`Histogram::overflow`]; quantiles that fall
//! there report the largest value recorded.
//!
//! The worker records into a histogram of its own, once per delivered transaction with
//! [`Histogram::record_n`] (every event of a transaction has the same latency), and from time to
//! time flushes it into the sink's histogram in shared memory with [`Histogram::merge`].
//!
//! # Exposition
//!
//! [`Exposition`] writes the Prometheus text exposition format, version 0.0.4
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/>): `# HELP` and `# TYPE` once
//! per family, then one line per sample; a histogram becomes cumulative `_bucket` lines at
//! [`PROMETHEUS_BOUNDS_MICROS`], `_sum` and `_count`.
use std::collections::HashSet;

/// log2 of the sub-buckets per power of two: 16 sub-buckets, relative error below 1/16.
const SUB_BITS: u32 = 4;
/// Sub-buckets per power of two.
const SUB: usize = 1 << SUB_BITS;
/// Values below `2^MAX_EXP` µs (about 12.7 days) get their own bucket; larger ones overflow.
const MAX_EXP: u32 = 40;

/// Number of buckets of a [`Histogram`]: 32 exact ones, then 16 per power of two up to 2^40.
pub const BUCKETS: usize = (MAX_EXP - SUB_BITS + 1) as usize * SUB;

/// Latency bounds (µs) of the `_bucket` lines [`Exposition::histogram`] writes: 1 ms to 60 s.
pub const PROMETHEUS_BOUNDS_MICROS: &[u64] = &[
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000, 30_000_000, 60_000_000,
];

/// The bucket holding `micros`.
fn bucket_of(micros: u64) -> usize {
    if micros < SUB as u64 {
        return micros as usize;
    }
    // micros is in [2^k, 2^(k+1)), k >= SUB_BITS; its top SUB_BITS + 1 bits pick the sub-bucket.
    let k = micros.ilog2();
    if k >= MAX_EXP {
        return BUCKETS - 1;
    }
    let shift = k - SUB_BITS;
    (k - SUB_BITS + 1) as usize * SUB + ((micros >> shift) as usize & (SUB - 1))
}

/// The largest value bucket `i` holds (`u64::MAX` for the top bucket, which takes the overflow).
fn bucket_upper(i: usize) -> u64 {
    if i == BUCKETS - 1 {
        return u64::MAX;
    }
    if i < SUB {
        return i as u64;
    }
    let shift = (i / SUB) as u32 - 1;
    let sub = (SUB + i % SUB) as u64;
    ((sub + 1) << shift) - 1
}

/// A latency histogram of microsecond values, in log-linear buckets (see the [module
/// docs](self)): bounded memory, relative error below 1/16.
///
/// Plain data, so it can live in shared memory. [`Default`] is the empty histogram, and is all
/// zero bytes. Counts and the sum saturate instead of wrapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Histogram {
    /// Values recorded per bucket.
    counts: [u64; BUCKETS],
    /// Values recorded (the sum of `counts`).
    count: u64,
    /// Sum of the values recorded.
    sum: u64,
    /// Smallest value recorded; meaningless while `count` is 0, so that zeroed memory is empty.
    min: u64,
    /// Largest value recorded (0 while empty).
    max: u64,
    /// Values recorded at or above 2^40 µs (also counted in the top bucket).
    overflow: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: [0; BUCKETS], count: 0, sum: 0, min: 0, max: 0, overflow: 0 }
    }
}

impl Histogram {
    /// Records one value.
    pub fn record(&mut self, micros: u64) {
        self.record_n(micros, 1);
    }

    /// Records `n` values equal to `micros` (the events of one transaction); `n = 0` records
    /// nothing.
    pub fn record_n(&mut self, micros: u64, n: u64) {
        if n == 0 {
            return;
        }
        let b = &mut self.counts[bucket_of(micros)];
        *b = b.saturating_add(n);
        if micros >> MAX_EXP != 0 {
            self.overflow = self.overflow.saturating_add(n);
        }
        if self.count == 0 || micros < self.min {
            self.min = micros;
        }
        self.max = self.max.max(micros);
        self.count = self.count.saturating_add(n);
        self.sum = self.sum.saturating_add(micros.saturating_mul(n));
    }

    /// Adds the values of `other`, as if they had been recorded here.
    pub fn merge(&mut self, other: &Histogram) {
        if other.count == 0 {
            return;
        }
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c = c.saturating_add(*o);
        }
        if self.count == 0 || other.min < self.min {
            self.min = other.min;
        }
        self.max = self.max.max(other.max);
        self.count = self.count.saturating_add(other.count);
        self.sum = self.sum.saturating_add(other.sum);
        self.overflow = self.overflow.saturating_add(other.overflow);
    }

    /// Empties the histogram.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the values recorded (saturating at `u64::MAX`).
    pub fn sum_micros(&self) -> u64 {
        self.sum
    }

    /// Largest value recorded, exactly (0 when empty).
    pub fn max_micros(&self) -> u64 {
        self.max
    }

    /// Smallest value recorded, exactly; `None` when empty.
    pub fn min_micros(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    /// Number of values recorded at or above 2^40 µs (about 12.7 days), beyond the buckets'
    /// precision.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// The `q`-quantile (`q` in `[0, 1]`; 0.99 is p99), `None` when empty.
    ///
    /// The answer is the upper bound of the bucket holding the `ceil(q * count)`-th smallest value
    /// (at least the first), clamped to [`Histogram::max_micros`]: never below that value, and
    /// above it by less than 1/16 of it. `q = 1` gives the maximum exactly, and so does any
    /// quantile that falls in the top bucket.
    pub fn quantile_micros(&self, q: f64) -> Option<u64> {
        debug_assert!((0.0..=1.0).contains(&q), "quantile {q} outside [0, 1]");
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        let bucket = self.counts.iter().position(|&c| {
            seen = seen.saturating_add(c);
            seen >= rank
        });
        Some(bucket.map_or(self.max, |i| bucket_upper(i).min(self.max)))
    }

    /// [`Histogram::quantile_micros`] in milliseconds, with 3 decimals (whole microseconds).
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        self.quantile_micros(q).map(|us| us as f64 / 1000.0)
    }

    /// For each bound `b` of `bounds_micros` (ascending), `(b, number of values <= b)`, as
    /// Prometheus `le` buckets want.
    ///
    /// A value counts as `<= b` only when its whole bucket is, so a value less than one bucket width
    /// (at most `b / 16`) below `b` may count only from the next bound on: the counts are never
    /// too high, and are exact below 32 µs and at bounds that end a bucket. A bound of
    /// `u64::MAX` counts everything.
    pub fn cumulative_buckets<'a>(&'a self, bounds_micros: &'a [u64]) -> impl Iterator<Item = (u64, u64)> + 'a {
        debug_assert!(bounds_micros.windows(2).all(|w| w[0] < w[1]), "bounds not ascending");
        let (mut next, mut cumulative) = (0, 0u64);
        bounds_micros.iter().map(move |&b| {
            while next < BUCKETS && bucket_upper(next) <= b {
                cumulative = cumulative.saturating_add(self.counts[next]);
                next += 1;
            }
            (b, cumulative)
        })
    }
}

/// The type of a metric family (`# TYPE` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A count that only grows (name ends in `_total` by convention).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A [`Histogram`], written by [`Exposition::histogram`].
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A Prometheus text exposition (format 0.0.4, served as `text/plain; version=0.0.4`) being
/// written.
///
/// Metric and label names are not escaped, only checked by `debug_assert!`: callers pass
/// constants matching `[a-zA-Z_:][a-zA-Z0-9_:]*` and `[a-zA-Z_][a-zA-Z0-9_]*`. Label values and
/// help text may be anything; they are escaped. Write a family's samples right after its
/// [`Exposition::family`] call, as the format requires them to be grouped.
#[derive(Debug, Default)]
pub struct Exposition {
    /// The text so far.
    out: String,
    /// Families whose `# HELP` and `# TYPE` are written.
    families: HashSet<String>,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts family `name`: writes its `# HELP` and `# TYPE` lines, unless already written.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(is_metric_name(name), "bad metric name {name:?}");
        if !self.families.insert(name.to_owned()) {
            return;
        }
        self.out.push_str("# HELP ");
        self.out.push_str(name);
        self.out.push(' ');
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
        self.out.push_str("\n# TYPE ");
        self.out.push_str(name);
        self.out.push(' ');
        self.out.push_str(kind.as_str());
        self.out.push('\n');
    }

    /// Writes one sample `name{labels} value` (`NaN`, `+Inf` and `-Inf` spelled as Prometheus
    /// spells them).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        debug_assert!(is_metric_name(name), "bad metric name {name:?}");
        self.line(name, "", labels, None, &format_value(value));
    }

    /// Writes `h` as `name_bucket` lines at [`PROMETHEUS_BOUNDS_MICROS`] and `+Inf`, `name_sum`
    /// and `name_count`. With `unit_seconds` (for `_seconds` metrics) the bounds and the sum are
    /// in seconds, otherwise in microseconds. The bucket counts err as
    /// [`Histogram::cumulative_buckets`] says.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram, unit_seconds: bool) {
        debug_assert!(is_metric_name(name), "bad metric name {name:?}");
        debug_assert!(labels.iter().all(|(l, _)| *l != "le"), "label le is the histogram's own");
        let micros = |us: u64| if unit_seconds { format_value(us as f64 / 1e6) } else { us.to_string() };
        for (bound, count) in h.cumulative_buckets(PROMETHEUS_BOUNDS_MICROS) {
            self.line(name, "_bucket", labels, Some(&micros(bound)), &count.to_string());
        }
        let count = h.count().to_string();
        self.line(name, "_bucket", labels, Some("+Inf"), &count);
        self.line(name, "_sum", labels, None, &micros(h.sum_micros()));
        self.line(name, "_count", labels, None, &count);
    }

    /// The exposition text.
    pub fn finish(self) -> String {
        self.out
    }

    /// Writes `{name}{suffix}{labels, le} {value}`.
    fn line(&mut self, name: &str, suffix: &str, labels: &[(&str, &str)], le: Option<&str>, value: &str) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        let mut sep = '{';
        for (label, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            debug_assert!(is_label_name(label), "bad label name {label:?}");
            self.out.push(sep);
            sep = ',';
            self.out.push_str(label);
            self.out.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        if sep == ',' {
            self.out.push('}');
        }
        self.out.push(' ');
        self.out.push_str(value);
        self.out.push('\n');
    }
}

/// A sample value as Prometheus parses it (Go's `ParseFloat`, plus `+Inf`/`-Inf`/`NaN`).
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        v.to_string()
    }
}

/// Whether `name` matches `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` matches `[a-zA-Z_][a-zA-Z0-9_]*`.
fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lowest value of bucket `i`.
    fn bucket_lower(i: usize) -> u64 {
        if i == 0 {
            0
        } else {
            bucket_upper(i - 1) + 1
        }
    }

    /// A simple LCG (Knuth's MMIX constants): reproducible pseudo-random values without a crate.
    fn lcg(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state >> 11
    }

    fn of(values: impl IntoIterator<Item = u64>) -> Histogram {
        let mut h = Histogram::default();
        values.into_iter().for_each(|v| h.record(v));
        h
    }

    #[test]
    fn buckets_tile_the_range_in_order() {
        assert_eq!(BUCKETS, 592);
        assert_eq!(std::mem::size_of::<Histogram>(), (BUCKETS + 5) * 8);
        for i in 0..BUCKETS - 1 {
            assert_eq!(bucket_of(bucket_lower(i)), i, "bucket {i}");
            assert_eq!(bucket_of(bucket_upper(i)), i, "bucket {i}");
            assert!(bucket_lower(i) <= bucket_upper(i));
        }
        assert_eq!(bucket_lower(BUCKETS - 1), (1 << MAX_EXP) - (1 << (MAX_EXP - 1 - SUB_BITS)));
        assert_eq!(bucket_of((1 << MAX_EXP) - 1), BUCKETS - 1);
        assert_eq!(bucket_of(1 << MAX_EXP), BUCKETS - 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn small_values_are_exact() {
        for v in 0..32 {
            assert_eq!((bucket_lower(bucket_of(v)), bucket_upper(bucket_of(v))), (v, v));
            let h = of([v, 1_000_000]);
            assert_eq!(h.quantile_micros(0.5), Some(v));
            assert_eq!(h.min_micros(), Some(v));
        }
        assert_eq!(bucket_upper(bucket_of(32)), 33);
    }

    #[test]
    fn relative_error_stays_below_one_sixteenth() {
        let error = |v: u64| {
            // The top bucket's upper bound is u64::MAX for the overflow; below 2^40 it ends there.
            let reported = bucket_upper(bucket_of(v)).min((1 << MAX_EXP) - 1);
            assert!(reported >= v, "{v} reported as {reported}");
            if v == 0 {
                0.0
            } else {
                (reported - v) as f64 / v as f64
            }
        };
        let mut worst: f64 = 0.0;
        for v in 0..100_000 {
            worst = worst.max(error(v));
        }
        let mut state = 42;
        for _ in 0..100_000 {
            let r = lcg(&mut state);
            // Magnitudes spread from 2^0 to 2^40 (exclusive).
            let v = (r & ((1 << MAX_EXP) - 1)) >> ((r >> 47) % 40);
            worst = worst.max(error(v));
        }
        // The worst case is the lowest value of a bucket: (2^(k-4) - 1) / 2^k for the largest k.
        for i in SUB..BUCKETS - 1 {
            worst = worst.max(error(bucket_lower(i)));
        }
        eprintln!("worst relative error: {worst}");
        assert!(worst < 1.0 / 16.0);
        let k = MAX_EXP - 1;
        assert_eq!(worst, ((1u64 << (k - SUB_BITS)) - 1) as f64 / (1u64 << k) as f64);
    }

    #[test]
    fn quantiles_of_uniform_one_to_thousand() {
        let h = of(1..=1000);
        let within = |q: f64, exact: u64| {
            let got = h.quantile_micros(q).unwrap();
            assert!(got >= exact && (got - exact) as f64 <= exact as f64 / 16.0, "q={q}: {got} vs {exact}");
        };
        within(0.0, 1);
        within(0.5, 500);
        within(0.9, 900);
        within(0.99, 990);
        assert_eq!(h.quantile_micros(1.0), Some(1000));
        assert_eq!(h.quantile_micros(0.5), Some(511));
        assert_eq!(h.quantile_ms(0.99), Some(0.991));
        assert_eq!((h.count(), h.sum_micros(), h.min_micros(), h.max_micros()), (1000, 500_500, Some(1), 1000));
    }

    #[test]
    fn a_constant_latency_is_reported_exactly() {
        let mut h = Histogram::default();
        h.record_n(123_457, 10);
        for q in [0.0, 0.5, 0.99, 1.0] {
            assert_eq!(h.quantile_micros(q), Some(123_457));
        }
        assert_eq!(h.quantile_ms(0.5), Some(123.457));
    }

    #[test]
    fn merge_equals_recording_both() {
        let mut state = 7;
        let a: Vec<u64> = (0..500).map(|_| lcg(&mut state) >> 30).collect();
        let b: Vec<u64> = (0..300).map(|_| lcg(&mut state) >> 20).collect();
        let mut merged = of(a.iter().copied());
        merged.merge(&of(b.iter().copied()));
        assert_eq!(merged, of(a.iter().chain(&b).copied()));

        let mut into_empty = Histogram::default();
        into_empty.merge(&of(b.iter().copied()));
        assert_eq!(into_empty, of(b.iter().copied()));
        let mut with_empty = of(a.iter().copied());
        with_empty.merge(&Histogram::default());
        assert_eq!(with_empty, of(a.iter().copied()));
    }

    #[test]
    fn record_n_equals_n_records() {
        let mut h = of([5]);
        h.record_n(70_000, 4);
        h.record_n(9, 0);
        assert_eq!(h, of([5, 70_000, 70_000, 70_000, 70_000]));
        assert_eq!(h.min_micros(), Some(5));
    }

    #[test]
    fn huge_values_overflow_into_the_top_bucket() {
        let h = of([10, 1 << MAX_EXP, u64::MAX]);
        assert_eq!((h.count(), h.overflow()), (3, 2));
        assert_eq!(h.sum_micros(), u64::MAX);
        assert_eq!(h.max_micros(), u64::MAX);
        assert_eq!(h.quantile_micros(0.5), Some(u64::MAX));
        assert_eq!(h.quantile_micros(0.0), Some(10));
        let last = h.cumulative_buckets(&[60_000_000, u64::MAX]).collect::<Vec<_>>();
        assert_eq!(last, [(60_000_000, 1), (u64::MAX, 3)]);
        assert_eq!(of([(1 << MAX_EXP) - 1]).overflow(), 0);
    }

    #[test]
    fn empty_and_reset_histograms_have_no_quantiles() {
        let empty = Histogram::default();
        assert_eq!((empty.count(), empty.sum_micros(), empty.max_micros()), (0, 0, 0));
        assert_eq!(empty.min_micros(), None);
        assert_eq!(empty.quantile_micros(0.5), None);
        assert_eq!(empty.quantile_ms(0.99), None);
        assert!(empty.cumulative_buckets(PROMETHEUS_BOUNDS_MICROS).all(|(_, c)| c == 0));
        let mut h = of([1, 2, 3]);
        h.reset();
        assert_eq!(h, empty);
    }

    #[test]
    fn cumulative_buckets_are_monotone_and_end_at_count() {
        let mut state = 3;
        let h = of((0..10_000).map(|_| lcg(&mut state) >> 27));
        let bounds: Vec<u64> = PROMETHEUS_BOUNDS_MICROS.iter().copied().chain([u64::MAX]).collect();
        let counts: Vec<(u64, u64)> = h.cumulative_buckets(&bounds).collect();
        assert!(counts.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(counts.last(), Some(&(u64::MAX, h.count())));
        // Never more than the exact count, never less than the count one bucket width lower.
        let mut state = 3;
        let values: Vec<u64> = (0..10_000).map(|_| lcg(&mut state) >> 27).collect();
        for &(b, c) in &counts[..counts.len() - 1] {
            let exact = values.iter().filter(|&&v| v <= b).count() as u64;
            let lower = values.iter().filter(|&&v| v <= b - b / 16).count() as u64;
            assert!(lower <= c && c <= exact, "le {b}: {c} not in [{lower}, {exact}]");
        }
        // Bucket-aligned bounds are exact.
        let h = of([31, 32, 33, 34]);
        assert_eq!(h.cumulative_buckets(&[31, 33, 35]).collect::<Vec<_>>(), [(31, 1), (33, 3), (35, 4)]);
    }

    #[test]
    fn writes_counters_gauges_and_histograms() {
        let mut e = Exposition::new();
        e.family("cdc_events_delivered_total", Kind::Counter, "Events delivered.");
        e.sample("cdc_events_delivered_total", &[("sink", "kafka_a"), ("mode", "exactly_once")], 3.0);
        e.sample("cdc_events_delivered_total", &[("sink", "kafka_b"), ("mode", "at_least_once")], 1e15);
        e.family("cdc_events_delivered_total", Kind::Counter, "Ignored: written already.");
        e.family("cdc_lag_bytes", Kind::Gauge, "Bytes of WAL not yet delivered.");
        e.sample("cdc_lag_bytes", &[], 0.5);
        e.family("cdc_delivery_latency_seconds", Kind::Histogram, "Commit to delivery.");
        let mut h = Histogram::default();
        h.record(1_500); // bucket 1472..=1535: counted from le=0.0025
        h.record_n(40_000, 2); // bucket 38912..=40959: from le=0.05
        h.record(90_000_000); // beyond 60 s: only +Inf
        e.histogram("cdc_delivery_latency_seconds", &[("sink", "kafka_a")], &h, true);
        e.histogram("cdc_delivery_latency_seconds", &[], &Histogram::default(), false);
        let expected = r#"# HELP cdc_events_delivered_total Events delivered.
# TYPE cdc_events_delivered_total counter
cdc_events_delivered_total{sink="kafka_a",mode="exactly_once"} 3
cdc_events_delivered_total{sink="kafka_b",mode="at_least_once"} 1000000000000000
# HELP cdc_lag_bytes Bytes of WAL not yet delivered.
# TYPE cdc_lag_bytes gauge
cdc_lag_bytes 0.5
# HELP cdc_delivery_latency_seconds Commit to delivery.
# TYPE cdc_delivery_latency_seconds histogram
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.001"} 0
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.0025"} 1
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.005"} 1
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.01"} 1
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.025"} 1
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.05"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.1"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.25"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="0.5"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="1"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="2.5"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="5"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="10"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="30"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="60"} 3
cdc_delivery_latency_seconds_bucket{sink="kafka_a",le="+Inf"} 4
cdc_delivery_latency_seconds_sum{sink="kafka_a"} 90.0815
cdc_delivery_latency_seconds_count{sink="kafka_a"} 4
cdc_delivery_latency_seconds_bucket{le="1000"} 0
cdc_delivery_latency_seconds_bucket{le="2500"} 0
cdc_delivery_latency_seconds_bucket{le="5000"} 0
cdc_delivery_latency_seconds_bucket{le="10000"} 0
cdc_delivery_latency_seconds_bucket{le="25000"} 0
cdc_delivery_latency_seconds_bucket{le="50000"} 0
cdc_delivery_latency_seconds_bucket{le="100000"} 0
cdc_delivery_latency_seconds_bucket{le="250000"} 0
cdc_delivery_latency_seconds_bucket{le="500000"} 0
cdc_delivery_latency_seconds_bucket{le="1000000"} 0
cdc_delivery_latency_seconds_bucket{le="2500000"} 0
cdc_delivery_latency_seconds_bucket{le="5000000"} 0
cdc_delivery_latency_seconds_bucket{le="10000000"} 0
cdc_delivery_latency_seconds_bucket{le="30000000"} 0
cdc_delivery_latency_seconds_bucket{le="60000000"} 0
cdc_delivery_latency_seconds_bucket{le="+Inf"} 0
cdc_delivery_latency_seconds_sum 0
cdc_delivery_latency_seconds_count 0
"#;
        assert_eq!(e.finish(), expected);
    }

    #[test]
    fn escapes_help_and_label_values() {
        let mut e = Exposition::new();
        e.family("cdc_x", Kind::Gauge, "A \\ and \"quotes\"\nsecond line");
        e.sample("cdc_x", &[("table", "a\\b \"c\"\nd")], f64::NAN);
        e.sample("cdc_x", &[("table", "")], f64::INFINITY);
        e.sample("cdc_x", &[], f64::NEG_INFINITY);
        e.sample("cdc_x", &[], -2.25);
        assert_eq!(
            e.finish(),
            "# HELP cdc_x A \\\\ and \"quotes\"\\nsecond line\n# TYPE cdc_x gauge\n\
             cdc_x{table=\"a\\\\b \\\"c\\\"\\nd\"} NaN\ncdc_x{table=\"\"} +Inf\ncdc_x -Inf\ncdc_x -2.25\n"
        );
    }

    #[test]
    fn checks_names() {
        assert!(is_metric_name("cdc_events_total") && is_metric_name("job:rate_5m") && is_metric_name("_x"));
        assert!(!is_metric_name("") && !is_metric_name("5xx") && !is_metric_name("a-b") && !is_metric_name("é"));
        assert!(is_label_name("sink") && is_label_name("_a1"));
        assert!(!is_label_name("a:b") && !is_label_name("1a") && !is_label_name(""));
    }
}
