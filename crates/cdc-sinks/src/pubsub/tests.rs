use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use super::config::*;
use super::*;
use crate::testutil::event;

/// A publisher double with Pub/Sub's ordering-key rule: a key whose message failed is paused, and
/// its later messages fail unsent until it is resumed. `fail(n)` says whether the n-th message
/// handed over (from 1) fails with an answer of this class.
struct Double {
    handed: usize,
    outstanding: Vec<Message>,
    /// What the topic stored, in order.
    stored: Vec<Message>,
    paused: std::collections::HashSet<String>,
    fail: Box<dyn FnMut(usize) -> Option<ErrorClass>>,
    waits: usize,
}

impl Double {
    fn new(fail: impl FnMut(usize) -> Option<ErrorClass> + 'static) -> Self {
        Double {
            handed: 0,
            outstanding: Vec::new(),
            stored: Vec::new(),
            paused: Default::default(),
            fail: Box::new(fail),
            waits: 0,
        }
    }
}

impl PubSubApi for Double {
    fn publish(&mut self, message: Message) {
        self.outstanding.push(message);
    }

    fn wait(&mut self, _timeout: Duration) -> Result<(), ApiError> {
        self.waits += 1;
        let mut first = None;
        for m in std::mem::take(&mut self.outstanding) {
            self.handed += 1;
            if !m.ordering_key.is_empty() && self.paused.contains(&m.ordering_key) {
                first.get_or_insert(ApiError { class: ErrorClass::Retry, message: "paused".into() });
                continue;
            }
            match (self.fail)(self.handed) {
                Some(class) => {
                    self.paused.insert(m.ordering_key.clone());
                    first.get_or_insert(ApiError { class, message: "Unavailable: injected".into() });
                }
                None => self.stored.push(m),
            }
        }
        self.paused.clear();
        first.map_or(Ok(()), Err)
    }

    fn abandon(&mut self) {
        self.outstanding.clear();
        self.paused.clear();
    }
}

fn cfg(extra: serde_json::Value) -> PubSubSinkConfig {
    let mut v = json!({"project": "my-project", "topic": "orders-changes"});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    parse(&v).unwrap()
}

fn attr<'a>(m: &'a Message, name: &str) -> &'a str {
    m.attributes.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str()).unwrap()
}

#[test]
fn config_defaults_and_full_topic_names() {
    let c = cfg(json!({}));
    assert_eq!(c.topic_path(), "projects/my-project/topics/orders-changes");
    assert_eq!((c.endpoint.clone(), c.credentials_file.clone(), c.timeout_ms), (None, None, 30_000));
    let full = parse(&json!({"topic": "projects/other-proj/topics/t-1"})).unwrap();
    assert_eq!((full.project.as_str(), full.topic.as_str()), ("other-proj", "t-1"));
    let scoped = parse(&json!({"project": "example.com:my-proj", "topic": "abc"})).unwrap();
    assert_eq!(scoped.topic_path(), "projects/example.com:my-proj/topics/abc");
}

#[test]
fn config_errors_name_the_key() {
    let err = |v: serde_json::Value| {
        let e = parse(&v).unwrap_err();
        assert_eq!(e.kind.sqlstate(), "22023", "{v}");
        e.message
    };
    assert_eq!(err(json!({"project": "my-project"})), "config.topic is required for a Pub/Sub sink");
    assert_eq!(err(json!({"topic": "abc"})), "config.project is required for a Pub/Sub sink");
    assert!(err(json!({"project": "My_Project", "topic": "abc"})).contains("not a Google Cloud project id"));
    assert!(err(json!({"project": "my-project", "topic": "goog-x"})).contains("not a valid Pub/Sub topic name"));
    assert!(err(json!({"project": "my-project", "topic": "ab"})).contains("not a valid Pub/Sub topic name"));
    assert!(err(json!({"project": "my-project", "topic": "1abc"})).contains("not a valid Pub/Sub topic name"));
    assert!(err(json!({"project": "other-proj", "topic": "projects/my-project/topics/abc"})).contains("differs"));
    assert!(err(json!({"project": "my-project", "topic": "abc", "endpoint": "pubsub:443"})).contains("endpoint"));
    assert!(err(json!({"project": "my-project", "topic": "abc", "credentials_file": "sa.json"})).contains("absolute"));
    assert!(err(json!({"project": "my-project", "topic": "abc", "exactly_once": true})).contains("at-least-once"));
    assert!(err(json!({"project": "my-project", "topic": "abc", "timeout_ms": 5})).contains("timeout_ms"));
    assert!(err(json!({"project": "my-project", "topic": "abc", "ordering": true})).contains("ordering"));
}

#[test]
fn a_message_carries_the_event_its_key_and_its_identity() {
    let ev = event(100, 3, 7);
    let m = message_of(&ev);
    assert_eq!(m.data, ev.payload);
    assert_eq!(m.ordering_key, "{\"id\":7}");
    assert_eq!(attr(&m, "id"), "100-3");
    assert_eq!(attr(&m, "commit_lsn"), "100");
    assert_eq!(attr(&m, "table"), "public.orders");
    assert_eq!(attr(&m, "operation"), "INSERT");
    let mut keyless = event(100, 1, 1);
    keyless.key = None;
    assert_eq!(ordering_key_of(&keyless), "", "no key, no order to keep");
    let mut long = event(100, 1, 1);
    long.key = Some(vec![b'x'; MAX_ORDERING_KEY_BYTES + 1]);
    let k = ordering_key_of(&long);
    assert!(k.starts_with("sha256:") && k.len() == 7 + 64);
    assert_eq!(k, ordering_key_of(&long.clone()), "the same key, the same ordering key");
}

#[test]
fn a_failure_fails_the_delivery_and_its_reread_keeps_each_key_in_order() {
    // The 4th message handed over fails: its key's later messages are not stored, the others are.
    let mut sink = PubSubSink::new(&cfg(json!({})), Double::new(|n| (n == 4).then_some(ErrorClass::Retry)));
    let events: Vec<_> = (0..12).map(|i| event(100 + i / 4, (i % 4 + 1) as u32, (i % 3) as u32)).collect();
    sink.send(&events).unwrap();
    let e = sink.flush(Checkpoint { end_lsn: cdc_core::Lsn(1) }).unwrap_err();
    assert_eq!(e.class, ErrorClass::Retry);
    assert!(e.message.starts_with("Pub/Sub topic \"projects/my-project/topics/orders-changes\": Unavailable"), "{e:?}");
    sink.abort();
    // The worker reads the delivery again: everything is published again.
    sink.send(&events).unwrap();
    sink.flush(Checkpoint { end_lsn: cdc_core::Lsn(1) }).unwrap();
    let stored = &sink.api_mut().stored;
    // First arrivals, per ordering key, in commit order; every event arrived.
    let mut first: HashMap<String, Vec<(u64, u32)>> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for m in stored {
        let id = attr(m, "id").to_string();
        let (c, i) = id.split_once('-').unwrap();
        if seen.insert(id.clone()) {
            first.entry(m.ordering_key.clone()).or_default().push((c.parse().unwrap(), i.parse().unwrap()));
        }
    }
    assert_eq!(seen.len(), 12);
    for (k, ids) in &first {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, &sorted, "key {k} out of order");
    }
    // The failed message's key (id 0: events 0, 3, 6, 9) stored nothing after the failure.
    let failed_key = "{\"id\":0}";
    let before_retry: Vec<_> =
        stored.iter().take_while(|m| attr(m, "id") != "100-1" || m.ordering_key != failed_key).collect();
    assert!(before_retry.iter().all(|m| m.ordering_key != failed_key), "nothing of the paused key before the retry");
}

#[test]
fn an_operator_error_and_a_too_large_event() {
    let mut sink = PubSubSink::new(&cfg(json!({})), Double::new(|_| Some(ErrorClass::Operator)));
    sink.send(&[event(10, 1, 1)]).unwrap();
    assert_eq!(sink.flush(Checkpoint { end_lsn: cdc_core::Lsn(1) }).unwrap_err().class, ErrorClass::Operator);
    let mut big = event(10, 1, 1);
    big.payload = vec![b' '; MAX_MESSAGE_BYTES + 1];
    let e = sink.send(&[big]).unwrap_err();
    assert_eq!(e.class, ErrorClass::Operator);
    assert!(e.message.contains("more than a Pub/Sub message holds"), "{}", e.message);
    assert_eq!(classify_code("NotFound"), ErrorClass::Operator);
    assert_eq!(classify_code("PermissionDenied"), ErrorClass::Operator);
    assert_eq!(classify_code("Unavailable"), ErrorClass::Retry);
    assert_eq!(classify_code("ResourceExhausted"), ErrorClass::Retry);
}

#[test]
fn outstanding_messages_are_bounded() {
    let mut sink = PubSubSink::new(&cfg(json!({"max_outstanding_messages": 5})), Double::new(|_| None::<ErrorClass>));
    let events: Vec<_> = (0..12).map(|i| event(100, i + 1, i)).collect();
    sink.send(&events).unwrap();
    assert_eq!(sink.api_mut().waits, 2, "waited after the 5th and the 10th");
    assert_eq!(sink.api_mut().outstanding.len(), 2);
    sink.flush(Checkpoint { end_lsn: cdc_core::Lsn(1) }).unwrap();
    assert_eq!(sink.api_mut().stored.len(), 12);
}
