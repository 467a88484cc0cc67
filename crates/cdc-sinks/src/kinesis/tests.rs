use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use super::config::*;
use super::*;
use crate::testutil::event;

/// What the double does with one request.
enum Fault {
    /// Stores every record.
    None,
    /// Fails the whole request with an answer (throttled, 500).
    Request(ErrorClass),
    /// Fails the whole request without an answer (no connection).
    Unanswered,
    /// Fails the records at these positions with this code; stores the others.
    Records(Vec<usize>, &'static str),
}

/// The double's script: the fault of the n-th call (from 1).
type Script = Box<dyn FnMut(usize, &[&Entry]) -> Fault>;

/// A Kinesis stream double: stores what it accepts in arrival order, with a scripted fault per call.
struct Double {
    landed: Vec<Entry>,
    requests: Vec<Vec<String>>,
    fault: Script,
}

impl Double {
    fn new(fault: impl FnMut(usize, &[&Entry]) -> Fault + 'static) -> Self {
        Double { landed: Vec::new(), requests: Vec::new(), fault: Box::new(fault) }
    }
}

impl KinesisApi for Double {
    fn put_records(&mut self, records: &[&Entry]) -> Result<Vec<Option<RecordError>>, ApiError> {
        self.requests.push(records.iter().map(|e| e.partition_key.clone()).collect());
        match (self.fault)(self.requests.len(), records) {
            Fault::None => {
                self.landed.extend(records.iter().map(|e| (*e).clone()));
                Ok(vec![None; records.len()])
            }
            Fault::Request(class) => {
                Err(ApiError { class, answered: true, message: "ServiceUnavailable: try again".into() })
            }
            Fault::Unanswered => {
                Err(ApiError { class: ErrorClass::Retry, answered: false, message: "connection refused".into() })
            }
            Fault::Records(failed, code) => Ok(records
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    if failed.contains(&i) {
                        Some(RecordError { code: code.into(), message: "Rate exceeded for shard".into() })
                    } else {
                        self.landed.push((*e).clone());
                        None
                    }
                })
                .collect()),
        }
    }
}

fn cfg(extra: serde_json::Value) -> KinesisSinkConfig {
    let mut v = json!({"stream_name": "orders"});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    parse(&v).unwrap()
}

fn sink(c: &KinesisSinkConfig, d: Double) -> KinesisSink<Double> {
    let mut s = KinesisSink::new(c, d);
    s.set_backoff(Backoff { first: Duration::from_micros(10), max: Duration::from_micros(100) });
    s
}

/// `n` events of one transaction over `keys` row ids, in order.
fn events(n: u32, keys: u32) -> Vec<Event> {
    (1..=n).map(|i| event(1000, i, i % keys)).collect()
}

#[test]
fn config_keys_defaults_and_refusals() {
    let c = parse(&json!({"stream_name": "orders-fraud-detection", "region": "us-east-1", "format": "json"})).unwrap();
    assert_eq!((c.stream_name.as_str(), c.region.as_deref()), ("orders-fraud-detection", Some("us-east-1")));
    assert_eq!(
        (c.batch_max_records, c.batch_max_bytes, c.timeout_ms, c.retry_timeout_ms),
        (500, 5 << 20, 10_000, 30_000)
    );
    assert!(c.endpoint.is_none() && c.profile.is_none());
    let with_key = parse(&json!({"stream_name": "t", "partition_key": "account_id"})).unwrap();
    assert_eq!(with_key.common.partition_key.as_deref(), Some("account_id"));
    for (bad, says) in [
        (json!({}), "config.stream_name is required"),
        (json!({"stream_name": "a b"}), "not a valid Kinesis stream name"),
        (json!({"stream_name": "s", "region": "US East"}), "not an AWS region name"),
        (json!({"stream_name": "s", "endpoint": "localhost:4568"}), "config.endpoint must be"),
        (json!({"stream_name": "s", "exactly_once": true}), "at-least-once"),
        (json!({"stream_name": "s", "batch_max_records": 501}), "batch_max_records"),
        (json!({"stream_name": "s", "strem": 1}), "strem"),
    ] {
        let e = parse(&bad).unwrap_err();
        assert!(e.message.contains(says), "{bad}: {}", e.message);
        assert_eq!(e.kind.sqlstate(), "22023");
    }
}

#[test]
fn partition_keys() {
    let mut ev = event(77, 3, 5);
    assert_eq!(partition_key_of(&ev), "{\"id\":5}");
    ev.key = Some(br#"{"account_id":"ACC-1"}"#.to_vec());
    assert_eq!(partition_key_of(&ev), r#"{"account_id":"ACC-1"}"#, "the Kafka sink's message key");
    ev.key = None;
    assert_eq!(partition_key_of(&ev), "77-3", "no key: the event's identity, the same on every send");
    let long = format!("\"{}\"", "x".repeat(300));
    ev.key = Some(long.clone().into_bytes());
    let pk = partition_key_of(&ev);
    assert!(pk.starts_with("sha256:") && pk.len() == 71, "{pk}");
    assert_eq!(pk, partition_key_of(&ev), "stable");
    ev.key = Some(Vec::new());
    assert_eq!(partition_key_of(&ev), "77-3", "never empty");
}

#[test]
fn error_codes() {
    for code in ["ProvisionedThroughputExceededException", "InternalFailure", "KMSThrottlingException", "Whatever"] {
        assert_eq!(classify_code(code), ErrorClass::Retry, "{code}");
    }
    for code in [
        "ResourceNotFoundException",
        "AccessDeniedException",
        "KMSAccessDeniedException",
        "UnrecognizedClientException",
    ] {
        assert_eq!(classify_code(code), ErrorClass::Operator, "{code}");
    }
}

#[test]
fn requests_stay_within_limits_and_hold_one_record_per_key() {
    let c = cfg(json!({}));
    let mut s = sink(&c, Double::new(|_, _| Fault::None));
    let evs = events(1200, 10_000);
    s.send(&evs).unwrap();
    s.flush(Checkpoint { end_lsn: cdc_core::Lsn(1) }).unwrap();
    let d = s.api_mut();
    assert_eq!(d.landed.len(), 1200);
    assert!(d.requests.iter().all(|r| r.len() <= 500), "{:?}", d.requests.iter().map(Vec::len).collect::<Vec<_>>());
    assert_eq!(d.requests.len(), 3, "full requests");
    assert!(d.landed.iter().zip(&evs).all(|(l, e)| l.data == e.payload), "data is the event, byte for byte");

    // A smaller batch_max_records.
    let c = cfg(json!({"batch_max_records": 7}));
    let mut s = sink(&c, Double::new(|_, _| Fault::None));
    s.send(&events(100, 1000)).unwrap();
    s.flush(Checkpoint { end_lsn: cdc_core::Lsn(1) }).unwrap();
    assert!(s.api_mut().requests.iter().all(|r| r.len() <= 7));
    assert_eq!(s.api_mut().landed.len(), 100);
}

#[test]
fn partial_failures_never_reorder_a_key_and_lose_nothing() {
    // Every third call fails a pseudo-random half of its records (throttled shards): the sink must
    // retry them before any later record of their keys, and store each record once.
    let mut seed = 7u64;
    let d = Double::new(move |call, recs| {
        if call % 3 != 0 {
            return Fault::None;
        }
        let failed = (0..recs.len())
            .filter(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (seed >> 33).is_multiple_of(2)
            })
            .collect();
        Fault::Records(failed, "ProvisionedThroughputExceededException")
    });
    let c = cfg(json!({"batch_max_records": 50}));
    let mut s = sink(&c, d);
    let evs = events(2000, 37);
    for chunk in evs.chunks(300) {
        s.send(chunk).unwrap();
    }
    s.flush(Checkpoint { end_lsn: cdc_core::Lsn(1) }).unwrap();
    assert!(s.retried_records() > 100, "the faults happened: {}", s.retried_records());
    let d = s.api_mut();
    assert!(d.requests.iter().all(|r| {
        let mut keys = r.clone();
        keys.sort();
        keys.windows(2).all(|w| w[0] != w[1])
    }));
    assert_eq!(d.landed.len(), 2000, "each record once: nothing lost, nothing twice");
    let mut by_key: HashMap<&str, Vec<&[u8]>> = HashMap::new();
    for l in &d.landed {
        by_key.entry(&l.partition_key).or_default().push(&l.data);
    }
    let mut expected: HashMap<String, Vec<&[u8]>> = HashMap::new();
    for e in &evs {
        expected.entry(partition_key_of(e)).or_default().push(&e.payload);
    }
    for (k, landed) in by_key {
        assert_eq!(landed, expected[k], "key {k} landed in send order");
    }
}

#[test]
fn a_key_waits_for_its_failed_record() {
    // Two records of one key and one of another; the first is throttled once. The second record
    // of that key must not be in the same request, nor be sent before the first is stored.
    let d = Double::new(|call, _| {
        if call == 1 {
            Fault::Records(vec![0], "ProvisionedThroughputExceededException")
        } else {
            Fault::None
        }
    });
    let mut s = sink(&cfg(json!({})), d);
    let (first, mut second, other) = (event(9, 1, 1), event(9, 2, 1), event(9, 3, 2));
    second.payload = b"{\"second\":1}".to_vec();
    s.send(&[first.clone(), second.clone(), other.clone()]).unwrap();
    s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap();
    let d = s.api_mut();
    assert_eq!(d.requests, vec![vec!["{\"id\":1}", "{\"id\":2}"], vec!["{\"id\":1}"], vec!["{\"id\":1}"]]);
    let landed: Vec<&[u8]> = d.landed.iter().map(|l| &l.data[..]).collect();
    assert_eq!(landed, vec![&other.payload[..], &first.payload[..], &second.payload[..]]);
}

#[test]
fn operator_errors_stop_at_once_and_transient_ones_time_out() {
    let d = Double::new(|_, _| Fault::Records(vec![0], "KMSAccessDeniedException"));
    let mut s = sink(&cfg(json!({})), d);
    s.send(&[event(9, 1, 1)]).unwrap();
    let e = s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap_err();
    assert_eq!(e.class, ErrorClass::Operator);
    assert!(
        e.message.contains("Kinesis stream \"orders\": KMSAccessDeniedException")
            && e.message.contains("public.orders"),
        "{}",
        e.message
    );
    assert_eq!(s.api_mut().requests.len(), 1);

    let d = Double::new(|_, _| Fault::Request(ErrorClass::Operator));
    let mut s = sink(&cfg(json!({})), d);
    s.send(&[event(9, 1, 1)]).unwrap();
    assert_eq!(s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap_err().class, ErrorClass::Operator);

    let d = Double::new(|_, _| Fault::Request(ErrorClass::Retry));
    let mut s = sink(&cfg(json!({"retry_timeout_ms": 20})), d);
    s.send(&[event(9, 1, 1)]).unwrap();
    let e = s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap_err();
    assert_eq!(e.class, ErrorClass::Retry);
    assert!(e.message.contains("no progress for 20 ms: ServiceUnavailable"), "{}", e.message);
    assert!(s.api_mut().requests.len() > 1, "retried in place before giving up");
    s.abort();
    assert!(s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).is_ok(), "abort dropped the queue");

    // No answer (the endpoint is down): the delivery fails at once, the worker backs off.
    let d = Double::new(|_, _| Fault::Unanswered);
    let mut s = sink(&cfg(json!({})), d);
    s.send(&[event(9, 1, 1)]).unwrap();
    let e = s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap_err();
    assert_eq!((e.class, e.message.as_str()), (ErrorClass::Retry, "Kinesis stream \"orders\": connection refused"));
    assert_eq!(s.api_mut().requests.len(), 1);

    // A transient failure that clears is retried in place: stored once, no error.
    let d = Double::new(|call, _| if call <= 2 { Fault::Request(ErrorClass::Retry) } else { Fault::None });
    let mut s = sink(&cfg(json!({})), d);
    s.send(&[event(9, 1, 1)]).unwrap();
    s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap();
    assert_eq!(s.api_mut().landed.len(), 1);
}

#[test]
fn a_record_over_one_mib_needs_an_operator() {
    let mut s = sink(&cfg(json!({})), Double::new(|_, _| Fault::None));
    let mut big = event(9, 1, 1);
    big.payload = vec![b'x'; MAX_RECORD_BYTES];
    let e = s.send(&[big]).unwrap_err();
    assert_eq!(e.class, ErrorClass::Operator);
    assert!(
        e.message.contains("more than the 1 MiB a Kinesis record holds") && e.message.contains("public.orders"),
        "{}",
        e.message
    );
}

#[test]
fn an_interrupt_ends_a_backoff() {
    let d = Double::new(|_, _| Fault::Request(ErrorClass::Retry));
    let mut s = KinesisSink::new(&cfg(json!({})), d);
    s.set_interrupt(|| true);
    s.send(&[event(9, 1, 1)]).unwrap();
    let started = std::time::Instant::now();
    let e = s.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap_err();
    assert!(e.message.contains("interrupted"), "{}", e.message);
    assert!(started.elapsed() < Duration::from_secs(5));
}
