use std::os::unix::fs::symlink;
use std::path::PathBuf;

use serde_json::json;

use super::*;
use crate::registry::parse_config;

fn cfg(sink_type: &str, config: serde_json::Value) -> SinkConfig {
    parse_config(sink_type, &config).unwrap()
}

fn state(r: CdcResult<()>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(e) => e.kind.sqlstate(),
    }
}

/// A fresh directory under the system's temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("pg_cdc_delegation_{name}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn path(&self, rel: &str) -> String {
        self.0.join(rel).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn code_running_kafka_properties_are_refused_and_others_pass() {
    for (key, _) in REFUSED_PROPERTIES {
        let c = cfg("kafka", json!({"bootstrap_servers": "b:9092", "topic": "t", "properties": {*key: "x"}}));
        assert_eq!(state(check_config(&c)), "42501", "{key}");
    }
    let c = cfg(
        "kafka",
        json!({"bootstrap_servers": "b:9092", "topic": "t",
                                "properties": {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                               "ssl.ca.location": "/x/ca.pem", "message.max.bytes": 1000000}}),
    );
    assert_eq!(state(check_config(&c)), "ok");
    // Event Hubs passes librdkafka properties through as well.
    let c = cfg(
        "eventhub",
        json!({"namespace": "ns", "eventhub": "orders", "connection_string_file": "c.txt",
                                   "properties": {"plugin.library.paths": "/tmp/evil.so"}}),
    );
    assert_eq!(state(check_config(&c)), "42501");
}

#[test]
fn a_postgres_sink_names_its_password_file_and_no_service() {
    let pg = |conn: &str| cfg("postgres", json!({"connection": conn}));
    assert_eq!(state(check_config(&pg("host=h dbname=d user=u passfile=/f/pgpass"))), "ok");
    assert_eq!(state(check_config(&pg("postgresql://u@h/d?passfile=/f/pgpass"))), "ok");
    assert_eq!(state(check_config(&pg("host=h dbname=d user=u"))), "42501", "the server's ~/.pgpass");
    assert_eq!(state(check_config(&pg("service=analytics passfile=/f/pgpass"))), "42501");
}

#[test]
fn every_file_a_config_names_is_listed_with_its_path() {
    let kafka = cfg(
        "kafka",
        json!({"bootstrap_servers": "b:9092", "topic": "t", "properties": {
        "ssl.ca.location": "/a/ca.pem", "ssl.key.location": "k.pem", "sasl.kerberos.keytab": "/a/kt",
        "sasl.oauthbearer.assertion.private.key.file": "/a/jwt.key", "ssl.crl.location": "probe",
        "linger.ms": 5}}),
    );
    let listed: Vec<String> = file_paths(&kafka).unwrap().into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        listed,
        [
            "config.properties.\"sasl.kerberos.keytab\"",
            "config.properties.\"sasl.oauthbearer.assertion.private.key.file\"",
            "config.properties.\"ssl.ca.location\"",
            "config.properties.\"ssl.key.location\"",
        ]
    );
    let pg = cfg("postgres", json!({"connection": "host=h user=u passfile=/a/pgpass sslrootcert=system sslkey=/a/k"}));
    let listed = file_paths(&pg).unwrap();
    assert_eq!(
        listed,
        [
            ("config.connection (passfile)".to_string(), "/a/pgpass".to_string()),
            ("config.connection (sslkey)".to_string(), "/a/k".to_string())
        ]
    );
    let webhook = cfg("webhook", json!({"url": "https://h/x", "secret_file": "/a/s"}));
    assert_eq!(file_paths(&webhook).unwrap().len(), 1);
    let pubsub = cfg("pubsub", json!({"project": "my-project", "topic": "orders", "credentials_file": "/a/c.json"}));
    assert_eq!(file_paths(&pubsub).unwrap().len(), 1);
    let pulsar = cfg("pulsar", json!({"service_url": "pulsar://h:6650", "topic": "t", "auth_token_file": "/a/t"}));
    assert_eq!(file_paths(&pulsar).unwrap().len(), 1);
    let hub = cfg("eventhub", json!({"namespace": "ns", "eventhub": "e", "connection_string_file": "c.txt"}));
    assert_eq!(file_paths(&hub).unwrap(), [("config.connection_string_file".to_string(), "c.txt".to_string())]);
    // Negative control: a config without files lists none.
    let plain = cfg("kafka", json!({"bootstrap_servers": "b:9092", "topic": "t"}));
    assert!(file_paths(&plain).unwrap().is_empty());
}

#[test]
fn files_are_confined_to_the_admin_directory_links_followed() {
    let root = Scratch::new("confine");
    let dir = root.path("admin");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(root.path("admin/ok.pem"), "x").unwrap();
    std::fs::write(root.path("outside.pem"), "x").unwrap();
    symlink(root.path("outside.pem"), root.path("admin/link.pem")).unwrap();
    symlink(root.path("admin/ok.pem"), root.path("inward.pem")).unwrap();

    assert_eq!(state(confine(Some(&dir), "p", &root.path("admin/ok.pem"))), "ok");
    // A link from outside to a file inside is that file.
    assert_eq!(state(confine(Some(&dir), "p", &root.path("inward.pem"))), "ok");
    assert_eq!(state(confine(Some(&dir), "p", &root.path("outside.pem"))), "42501");
    assert_eq!(state(confine(Some(&dir), "p", &root.path("admin/../outside.pem"))), "42501");
    assert_eq!(state(confine(Some(&dir), "p", &root.path("admin/link.pem"))), "42501");
    assert_eq!(state(confine(Some(&dir), "p", &dir)), "42501", "the directory itself");
    assert_eq!(state(confine(Some(&dir), "p", &root.path("admin/missing.pem"))), "42501");
    assert_eq!(state(confine(Some(&dir), "p", "/etc/passwd")), "42501");
    // A sibling whose name starts with the directory's is not inside it.
    std::fs::create_dir_all(root.path("admin2")).unwrap();
    std::fs::write(root.path("admin2/x.pem"), "x").unwrap();
    assert_eq!(state(confine(Some(&dir), "p", &root.path("admin2/x.pem"))), "42501");
    // Not set: no file at all.
    let e = confine(None, "config.secret_file", &root.path("admin/ok.pem")).unwrap_err();
    assert_eq!(e.kind.sqlstate(), "42501");
    assert!(e.message.contains("config.secret_file") && e.message.contains("cdc.admin_file_dir"), "{}", e.message);
    assert_eq!(state(confine(Some(""), "p", &root.path("admin/ok.pem"))), "42501");
}

#[test]
fn a_delegated_connection_needs_a_password_and_no_local_superuser() {
    use crate::postgres::libpq::delegated_refusal;
    let local = "7312345678901234567";
    assert_eq!(delegated_refusal(true, false, None, local), None, "a password, an ordinary role");
    assert_eq!(delegated_refusal(true, true, Some("1111"), local), None, "a superuser of another cluster");
    let trust = delegated_refusal(false, false, None, local).unwrap();
    assert!(trust.contains("did not ask for a password"), "{trust}");
    let local_super = delegated_refusal(true, true, Some(local), local).unwrap();
    assert!(local_super.contains("superuser's session on this"), "{local_super}");
    // Without a password, refused whoever it is.
    assert!(delegated_refusal(false, true, Some("1111"), local).is_some());
}
