use serde_json::{json, Value};

use super::*;

fn kafka(v: Value) -> KafkaSinkConfig {
    match parse_config("kafka", &v).unwrap() {
        SinkConfig::Kafka(c) => c,
        other => panic!("{other:?}"),
    }
}

#[test]
fn kafka_sink_config() {
    let c = kafka(json!({"bootstrap_servers": "127.0.0.1:9092", "topic": "orders-cdc", "format": "json",
        "acks": "all", "compression": "zstd", "batch_size": 16384, "linger_ms": 5, "properties": {"security.protocol": "SASL_SSL", "sasl.password": "canary-secret"}}));
    assert_eq!(c.topic, "orders-cdc");
    assert_eq!(c.properties["sasl.password"], "canary-secret");
    let e = |v| parse_config("kafka", &v).unwrap_err();
    assert_eq!(e(json!({})).message, "config.topic is required for a kafka sink");
    assert_eq!(e(json!({"topic": "a b"})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"topic": "{tabel}"})).message, "config.topic: unknown placeholder {tabel}");
    assert!(parse_config("kafka", &json!({"topic": "cdc.{database}.{schema}.{table}"})).is_ok());
    assert_eq!(e(json!({"topic": "t", "acks": 0})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"topic": ".."})).kind.sqlstate(), "22023");
    // Exactly-once is the default and needs acks=all; a transactional id needs exactly-once.
    assert!(c.exactly_once && c.transactional_id.is_none());
    let tx = kafka(json!({"topic": "t", "transactional_id": "tx-1"}));
    assert_eq!(tx.transactional_id.as_deref(), Some("tx-1"));
    assert_eq!(e(json!({"topic": "t", "acks": "1"})).kind.sqlstate(), "22023");
    assert!(!kafka(json!({"topic": "t", "acks": "1", "exactly_once": false})).exactly_once);
    assert_eq!(e(json!({"topic": "t", "exactly_once": false, "transactional_id": "x"})).kind.sqlstate(), "22023");
    // Protobuf: with or without a registry (Confluent's framing only with one).
    assert!(parse_config("kafka", &json!({"topic": "t", "format": "protobuf"})).is_ok());
    let proto = kafka(json!({"topic": "t", "format": "protobuf", "schema_registry": "http://registry:8081"}));
    assert_eq!(proto.common.schema_registry.as_deref(), Some("http://registry:8081"));
    // Avro: a registry URL is checked, and only the avro format takes one.
    let avro = kafka(json!({"topic": "t", "format": "avro", "schema_registry": "http://registry:8081/"}));
    assert_eq!(avro.common.schema_registry.as_deref(), Some("http://registry:8081"));
    assert_eq!(e(json!({"topic": "t", "schema_registry": "http://registry:8081"})).kind.sqlstate(), "22023");
    for bad in [
        "registry:8081",
        "http://",
        "http://:1",
        "http://h:0",
        "http://h:65536",
        "ftp://h",
        "http://h h",
        "http://h/?q",
    ] {
        assert_eq!(
            e(json!({"topic": "t", "format": "avro", "schema_registry": bad})).kind.sqlstate(),
            "22023",
            "{bad}"
        );
    }
    let secret = e(json!({"topic": "t", "format": "avro", "schema_registry": "http://u:canary-secret@h:x"}));
    assert!(!secret.message.contains("canary-secret"), "{}", secret.message);
    let eh = parse_config(
        "eventhub",
        &json!({"eventhub": "t", "namespace": "ns", "connection_string": "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v=", "format": "avro"}),
    );
    assert!(eh.is_ok(), "{eh:?}");
    for (t, c) in [
        ("webhook", json!({"url": "http://h/"})),
        ("kinesis", json!({"stream_name": "s"})),
        ("table", json!({"table": "e"})),
    ] {
        let mut c = c;
        c["format"] = json!("avro");
        assert_eq!(parse_config(t, &c).unwrap_err().kind.sqlstate(), "0A000", "{t}");
    }
    assert_eq!(e(json!({"topic": "t", "compression": "brotli"})).kind.sqlstate(), "22023");
    assert_eq!(
        e(json!({"topic": "t", "batch_size": "big"})).message,
        "config.batch_size must be an integer, not string"
    );
    assert_eq!(e(json!({"topic": "t", "topci": "x"})).hint.as_deref(), Some("Did you mean \"topic\"?"));
    let secret = e(json!({"topic": "t", "properties": {"bootstrap.servers": "canary-secret"}}));
    assert!(!format!("{secret:?}").contains("canary-secret"));
    let bad_value = e(json!({"topic": "t", "properties": {"sasl.password": ["canary-secret"]}}));
    assert!(!format!("{bad_value:?}").contains("canary-secret"));
}

#[test]
fn sink_types() {
    let e = parse_config("kafak", &json!({})).unwrap_err();
    assert_eq!(e.kind.sqlstate(), "22023");
    assert!(e.hint.unwrap().starts_with("Did you mean \"kafka\"?"));
    assert_eq!(parse_config("pulsar", &json!({})).unwrap_err().kind.sqlstate(), "22023");
    assert_eq!(parse_config("pubsub", &json!({})).unwrap_err().kind.sqlstate(), "22023");
    assert!(parse_config("nope", &json!({}))
        .unwrap_err()
        .hint
        .unwrap()
        .contains("kafka, table, webhook, eventhub, kinesis"));
}

#[test]
fn topic_templates_expand_safely() {
    assert_eq!(
        crate::kafka::config::expand_topic("cdc.{database}.{schema}.{table}", "db", "public", "My Table"),
        "cdc.db.public.My_Table"
    );
}

#[test]
fn an_empty_table_list_is_refused() {
    let e = parse_config("kafka", &json!({"topic": "t", "tables": []})).unwrap_err();
    assert_eq!(e.message, "config.tables must list at least one table");
}

#[test]
fn checkpoint_interval_is_a_common_key() {
    let s = parse_config("kafka", &json!({"topic": "t", "checkpoint_interval_ms": 500})).unwrap();
    assert_eq!(s.common().checkpoint_interval_ms, Some(500));
    assert!(parse_config("kafka", &json!({"topic": "t", "checkpoint_interval_ms": "soon"})).is_err());
}

#[test]
fn snapshot_mode_and_chunk_size_are_common_keys() {
    use cdc_core::config::SnapshotMode;
    let s = parse_config("kafka", &json!({"topic": "t"})).unwrap();
    assert_eq!((s.common().snapshot_mode, s.common().snapshot_chunk_size), (SnapshotMode::Initial, 8192));
    let t =
        parse_config("table", &json!({"table": "ev", "snapshot_mode": "never", "snapshot_chunk_size": 10})).unwrap();
    assert_eq!((t.common().snapshot_mode, t.common().snapshot_chunk_size), (SnapshotMode::Never, 10));
    let e = |v| parse_config("kafka", &v).unwrap_err();
    let only = parse_config("kafka", &json!({"topic": "t", "snapshot_mode": "initial_only"})).unwrap();
    assert_eq!(only.common().snapshot_mode, SnapshotMode::InitialOnly);
    assert!(only.common().snapshot_mode.snapshots() && !SnapshotMode::Never.snapshots());
    let bad = e(json!({"topic": "t", "snapshot_mode": "always"}));
    assert_eq!(
        (bad.kind.sqlstate(), bad.hint.as_deref()),
        ("22023", Some("Valid modes: initial (the default), initial_only, never."))
    );
    assert_eq!(e(json!({"topic": "t", "snapshot_chunk_size": 0})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"topic": "t", "snapshot_chunk_size": 1_000_001})).kind.sqlstate(), "22023");
}

#[test]
fn a_sink_level_partition_key_is_taken_by_every_sink_type() {
    let k = kafka(json!({"topic": "t", "partition_key": "account_id"}));
    assert_eq!(k.common.partition_key.as_deref(), Some("account_id"));
    let t = parse_config("table", &json!({"table": "cdc_events", "partition_key": "account_id"})).unwrap();
    assert_eq!(t.common().partition_key.as_deref(), Some("account_id"));
    let e = parse_config("kafka", &json!({"topic": "t", "partition_key": 7})).unwrap_err();
    assert_eq!(e.message, "config.partition_key must be a string, not number");
}

#[test]
fn delivery_modes() {
    assert_eq!(parse_config("kafka", &json!({"topic": "t"})).unwrap().delivery_mode(), DeliveryMode::ExactlyOnce);
    let alo = parse_config("kafka", &json!({"topic": "t", "acks": "1", "exactly_once": false})).unwrap();
    assert_eq!(alo.delivery_mode(), DeliveryMode::AtLeastOnce);
    assert_eq!(parse_config("table", &json!({"table": "e"})).unwrap().delivery_mode(), DeliveryMode::ExactlyOnce);
}

#[test]
fn the_debezium_format_takes_debeziums_settings_on_kafka_sinks_only() {
    use cdc_core::config::sink::{DebeziumConverter, DebeziumOptions, DecimalHandling, Format};
    let d = kafka(json!({"topic": "t", "format": "debezium"}));
    assert_eq!((d.common.format, &d.common.debezium), (Format::Debezium, &DebeziumOptions::default()));
    let o = DebeziumOptions::default();
    assert!(o.schemas && o.tombstones_on_delete && o.topic_prefix.is_none());
    assert_eq!(o.decimal_handling_mode, DecimalHandling::Precise);
    let set = kafka(json!({"topic": "t", "format": "debezium", "debezium": {
        "topic_prefix": "shop.eu-1", "schemas": false, "decimal_handling_mode": "double", "tombstones_on_delete": false}}));
    assert_eq!(
        set.common.debezium,
        DebeziumOptions {
            topic_prefix: Some("shop.eu-1".into()),
            schemas: false,
            decimal_handling_mode: DecimalHandling::Double,
            tombstones_on_delete: false,
            converter: DebeziumConverter::Json,
        }
    );
    // Connect's Avro converter: the registry is the sink's (or the table's, or the server's).
    let avro = kafka(json!({"topic": "t", "format": "debezium", "schema_registry": "http://registry:8081",
                            "debezium": {"converter": "avro"}}));
    assert_eq!(avro.common.debezium.converter, DebeziumConverter::Avro);
    let e = |v| parse_config("kafka", &v).unwrap_err();
    let without = e(json!({"topic": "t", "debezium": {"schemas": false}}));
    assert_eq!(
        (without.kind.sqlstate(), without.hint.as_deref()),
        ("22023", Some("Add \"format\": \"debezium\", or leave \"debezium\" out."))
    );
    let mode = e(json!({"topic": "t", "format": "debezium", "debezium": {"decimal_handling_mode": "exact"}}));
    assert_eq!(mode.hint.as_deref(), Some("Valid modes: precise (the default), string, double."));
    for bad in ["", "a b", "a/b"] {
        let p = e(json!({"topic": "t", "format": "debezium", "debezium": {"topic_prefix": bad}}));
        assert_eq!(p.kind.sqlstate(), "22023", "{bad}");
    }
    let conv = e(json!({"topic": "t", "format": "debezium", "debezium": {"converter": "protobuf"}}));
    assert_eq!(conv.hint.as_deref(), Some("Valid converters: json (the default), avro."));
    let both = e(json!({"topic": "t", "format": "debezium", "debezium": {"converter": "avro", "schemas": true}}));
    assert_eq!(both.hint.as_deref(), Some("Leave \"schemas\" out with \"converter\": \"avro\"."));
    let json_registry = e(json!({"topic": "t", "format": "debezium", "schema_registry": "http://registry:8081"}));
    assert_eq!(json_registry.kind.sqlstate(), "22023");
    let key = e(json!({"topic": "t", "format": "debezium", "debezium": {"schema": true}}));
    assert_eq!(key.hint.as_deref(), Some("Did you mean \"schemas\"?"));
    for (t, c) in [
        ("webhook", json!({"url": "http://h/"})),
        ("kinesis", json!({"stream_name": "s"})),
        ("table", json!({"table": "e"})),
        (
            "eventhub",
            json!({"eventhub": "t", "namespace": "ns", "connection_string": "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v="}),
        ),
    ] {
        let mut c = c;
        c["format"] = json!("debezium");
        assert_eq!(parse_config(t, &c).unwrap_err().kind.sqlstate(), "0A000", "{t}");
    }
}
