//! The Pulsar sink without a broker: its config, its messages, and its delivery over a scripted
//! client.
use std::time::Duration;

use serde_json::json;

use super::config::parse;
use super::*;
use crate::testutil::event;

#[derive(Default)]
struct Scripted {
    sent: Vec<Message>,
    waits: usize,
    fail_wait: Option<ApiError>,
    abandoned: usize,
}

impl PulsarApi for Scripted {
    fn send(&mut self, message: Message) -> Result<(), ApiError> {
        self.sent.push(message);
        Ok(())
    }
    fn wait(&mut self, _timeout: Duration) -> Result<(), ApiError> {
        self.waits += 1;
        self.fail_wait.take().map_or(Ok(()), Err)
    }
    fn abandon(&mut self) {
        self.abandoned += 1;
    }
}

#[test]
fn config_keys_and_refusals() {
    let c = parse(&json!({"service_url": "pulsar://127.0.0.1:6650", "topic": "cdc.{schema}.{table}"})).unwrap();
    assert_eq!(c.namespace, "persistent://public/default/");
    assert_eq!(c.topic, "cdc.{schema}.{table}");
    assert_eq!(c.timeout_ms, 30_000);
    let c = parse(&json!({"service_url": "pulsar+ssl://a:6651,b:6651", "topic": "persistent://acme/cdc/orders",
                          "producer_name": "orders-cdc", "auth_token_file": "/etc/pg_cdc/pulsar.token"}))
    .unwrap();
    assert_eq!((c.namespace.as_str(), c.topic.as_str()), ("persistent://acme/cdc/", "orders"));
    assert_eq!(c.producer_name.as_deref(), Some("orders-cdc"));
    let err = |v: serde_json::Value| parse(&v).unwrap_err();
    assert!(err(json!({"topic": "t"})).message.contains("service_url is required"));
    assert!(err(json!({"service_url": "http://x:8080", "topic": "t"})).message.contains("not a Pulsar service URL"));
    assert!(err(json!({"service_url": "pulsar://x:6650"})).message.contains("topic is required"));
    assert!(err(json!({"service_url": "pulsar://x:6650", "topic": "non-persistent://a/b/c"}))
        .message
        .contains("only persistent topics"));
    assert!(err(json!({"service_url": "pulsar://x:6650", "topic": "persistent://a/b"})).message.contains("<tenant>"));
    assert!(err(json!({"service_url": "pulsar://x:6650", "topic": "t{nope}"})).message.contains("placeholder"));
    assert!(err(json!({"service_url": "pulsar://x:6650", "topic": "t", "auth_token_file": "rel"}))
        .message
        .contains("absolute path"));
    assert!(err(json!({"service_url": "pulsar://x:6650", "topic": "t", "exactly_once": true}))
        .message
        .contains("at-least-once"));
    assert!(err(json!({"service_url": "pulsar://x:6650", "topic": "t", "producer_name": "a b"}))
        .message
        .contains("producer_name"));
    for e in [err(json!({"topic": "t"})), err(json!({"service_url": "pulsar://x:6650", "topic": "t", "x": 1}))] {
        assert_eq!(e.kind.sqlstate(), "22023");
    }
}

#[test]
fn messages_carry_the_event_its_key_and_its_identity() {
    let cfg =
        parse(&json!({"service_url": "pulsar://127.0.0.1:6650", "topic": "{database}.{schema}.{table}"})).unwrap();
    let mut sink = PulsarSink::new(&cfg, "shop", Scripted::default());
    let mut keyless = event(7, 2, 2);
    keyless.key = None;
    let evs = vec![event(7, 1, 1), keyless];
    let stats = sink.send(&evs).unwrap();
    assert_eq!(stats.events, 2);
    sink.flush(Checkpoint { end_lsn: cdc_core::Lsn(9) }).unwrap();
    let api = sink.api_mut();
    assert_eq!(api.waits, 1);
    let m = &api.sent[0];
    assert_eq!(m.topic, "persistent://public/default/shop.public.orders");
    assert_eq!(m.key.as_deref(), Some(r#"{"id":1}"#));
    assert_eq!(m.payload, evs[0].payload);
    assert!(m.properties.contains(&("id", "7-1".to_string())));
    assert!(m.properties.contains(&("table", "public.orders".to_string())));
    assert_eq!(api.sent[1].key, None);
}

#[test]
fn a_failed_receipt_fails_the_delivery_with_its_class() {
    let cfg = parse(&json!({"service_url": "pulsar://127.0.0.1:6650", "topic": "t"})).unwrap();
    let mut sink = PulsarSink::new(&cfg, "db", Scripted::default());
    sink.api_mut().fail_wait = Some(ApiError { class: ErrorClass::Retry, message: "connection closed".into() });
    sink.send(&[event(1, 1, 1)]).unwrap();
    let e = sink.flush(Checkpoint { end_lsn: cdc_core::Lsn(2) }).unwrap_err();
    assert_eq!(e.class, ErrorClass::Retry);
    assert!(e.message.contains("connection closed"));
    sink.abort();
    assert_eq!(sink.api_mut().abandoned, 1);
    assert_eq!(classify("Server error (Some(TopicNotFound)): topic not found"), ErrorClass::Operator);
    assert_eq!(
        classify("Server error (Some(AuthorizationError)): Proxy Client is not authorized"),
        ErrorClass::Operator
    );
    assert_eq!(classify("Connection error: Disconnected"), ErrorClass::Retry);
    assert_eq!(classify("Server error (Some(ServiceNotReady)): the broker is starting"), ErrorClass::Retry);
}
