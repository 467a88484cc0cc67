use serde_json::json;

use super::config::*;

const CS: &str =
    "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=canary-secret=";

#[test]
fn becomes_a_sasl_ssl_kafka_config() {
    let c = parse(&json!({"namespace": "contoso", "eventhub": "orders", "connection_string": CS})).unwrap();
    assert!(!c.exactly_once, "at-least-once by default");
    let k = c.kafka_config(CS);
    assert_eq!(k.bootstrap_servers.as_deref(), Some("contoso.servicebus.windows.net:9093"));
    assert_eq!(k.topic, "orders");
    assert_eq!(k.properties["security.protocol"], "SASL_SSL");
    assert_eq!(k.properties["sasl.mechanism"], "PLAIN");
    assert_eq!(k.properties["sasl.username"], "$ConnectionString");
    assert_eq!(k.properties["sasl.password"], CS);
    assert!(!format!("{c:?}").contains("canary-secret"), "Debug never shows the connection string");
    let local =
        parse(&json!({"bootstrap_servers": "127.0.0.1:9094", "eventhub": "e", "connection_string_file": "eh.conn",
                              "exactly_once": true, "properties": {"ssl.ca.location": "/tmp/ca.pem"}}))
        .unwrap();
    assert_eq!(local.connection, Connection::File("eh.conn".into()));
    let k = local.kafka_config("x");
    assert!(k.exactly_once && k.bootstrap_servers.as_deref() == Some("127.0.0.1:9094"));
    assert_eq!(k.properties["ssl.ca.location"], "/tmp/ca.pem");
}

#[test]
fn config_errors_never_echo_the_connection_string() {
    let e = |v| parse(&v).unwrap_err();
    assert_eq!(
        e(json!({"namespace": "n", "connection_string": CS})).message,
        "config.eventhub is required for an eventhub sink"
    );
    assert_eq!(e(json!({"eventhub": "e", "connection_string": CS})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"namespace": "n", "eventhub": "e"})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"namespace": "a.b", "eventhub": "e", "connection_string": CS})).kind.sqlstate(), "22023");
    let both = e(json!({"namespace": "n", "eventhub": "e", "connection_string": CS, "connection_string_file": "f"}));
    assert_eq!(both.kind.sqlstate(), "22023");
    let bad = e(json!({"namespace": "n", "eventhub": "e", "connection_string": "Endpoint=http://x;canary-secret"}));
    assert!(!format!("{bad:?}").contains("canary-secret") && bad.message.contains("Endpoint=sb://"));
    let reserved = e(json!({"namespace": "n", "eventhub": "e", "connection_string": CS,
                            "properties": {"sasl.password": "canary-secret"}}));
    assert!(!format!("{reserved:?}").contains("canary-secret"));
    assert!(check_connection_string("Endpoint=sb://x/;SharedAccessSignature=SharedAccessSignature sr=x").is_ok());
}
