//! Opening a sink from its config: with the registry ([`crate::registry`]), the one place that names
//! the sink types. The worker hands in an [`OpenContext`] (the sink's names, the server settings it
//! read, who added it, the source tables an apply sink needs) and gets back either
//! - a sink it opens in its own transaction ([`open_in_place`]): the in-database sink, whose events
//!   are written through the [`EventStore`] the worker gives it, and a webhook, which only reads its
//!   secret; or
//! - a thread opening one ([`start_open`]): a Kafka or Event Hubs producer fences the older
//!   producers of its pipeline and reads its checkpoint (up to the transaction timeout while the
//!   broker is unreachable), a Kinesis client finds its credentials, a Pub/Sub, Pulsar or PostgreSQL
//!   connection is made. None of that may stall the other sinks. The thread touches nothing of
//!   PostgreSQL and starts with every signal blocked ([`with_signals_blocked`]), so PostgreSQL's
//!   handlers stay on the worker's main thread.
use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::eventhub::config::Connection;
use crate::kafka::config::KafkaSinkConfig;
use crate::kafka::{KafkaSink, Transactional};
use crate::kinesis::aws::{AwsKinesis, Defaults};
use crate::postgres::libpq::Libpq;
use crate::postgres::{PostgresSink, SourceTable};
use crate::pubsub::google::GooglePubSub;
use crate::pulsar::client::PulsarClient;
use crate::table::config::TableSinkConfig;
use crate::table::{EventStore, TableSink};
use crate::webhook::WebhookSink;
use crate::{Checkpoint, ErrorClass, Sink, SinkConfig, SinkError};

pub use crate::kafka::with_signals_blocked;

/// The server settings opening a sink reads (the worker reads them from PostgreSQL).
#[derive(Debug, Clone, Default)]
pub struct ServerSettings {
    /// `cdc.kafka_bootstrap_servers`: for Kafka sinks whose config names none.
    pub kafka_bootstrap_servers: String,
    /// `cdc.aws_region` and `cdc.kinesis_endpoint`, for Kinesis sinks whose config names none.
    pub kinesis: Defaults,
    /// `cdc.pubsub_endpoint`, for Pub/Sub sinks whose config names none.
    pub pubsub_endpoint: Option<String>,
    /// `cdc.test_pulsar_reuse_producer_name` (test only).
    pub pulsar_reuse_producer_name: bool,
    /// `cdc.test_apply_shuffle` (test only).
    pub apply_shuffle: i64,
}

/// Everything opening a sink needs besides its config.
#[derive(Debug, Clone, Default)]
pub struct OpenContext {
    /// The sink's id (uuid text): the key of its progress records.
    pub sink_id: String,
    /// The sink's name (client ids, application names, producer names).
    pub sink_name: String,
    /// Its slot's name (`_cdc_<hex>`): names its progress topic and pipeline.
    pub slot: String,
    /// This cluster's `system_identifier` (text): part of the pipeline's name.
    pub system_identifier: String,
    /// The source database's name and OID.
    pub database: String,
    /// The source database's OID.
    pub database_oid: u64,
    /// The server settings in force.
    pub settings: ServerSettings,
    /// Added by a role that is not a superuser ([`crate::delegation`]): a PostgreSQL sink's
    /// connection is checked.
    pub delegated: bool,
    /// The tables the sink carries, by OID: their keys and schema histories (an apply sink creates
    /// and alters its target tables from them).
    pub source_tables: HashMap<u32, SourceTable>,
    /// Checked while a call to the destination waits: true gives up (a stop request).
    pub interrupt: Option<fn() -> bool>,
}

impl OpenContext {
    /// The name of the sink's pipeline: a Kafka transactional id (unless the config gives one), an
    /// apply sink's bookkeeping key. Stable across restarts, unique per cluster, database and slot.
    pub fn pipeline(&self) -> String {
        let hex = self.slot.trim_start_matches("_cdc_");
        format!("pg_cdc-{}-{}-{hex}", self.system_identifier, self.database_oid)
    }

    fn interrupt(&self) -> fn() -> bool {
        self.interrupt.unwrap_or(|| false)
    }
}

/// A sink opened on its own thread.
pub type Opened = Box<dyn Sink + Send>;

/// A sink being opened on its own thread, and what it gives: the sink and the checkpoint its
/// destination holds.
pub type Opening = JoinHandle<Result<(Opened, Option<Checkpoint>), SinkError>>;

fn operator(message: String) -> SinkError {
    SinkError { class: ErrorClass::Operator, message }
}

/// Opens a sink that opens quickly, in the caller's transaction: the in-database sink (over the store
/// `table_store` makes for it; its checkpoint read from it) or a webhook (its secret read). `None`
/// for the other types, which open on a thread of their own ([`start_open`]).
#[allow(clippy::type_complexity)]
pub fn open_in_place(
    config: &SinkConfig,
    table_store: impl FnOnce(&TableSinkConfig) -> Result<Box<dyn EventStore>, SinkError>,
) -> Result<Option<(Box<dyn Sink>, Option<Checkpoint>)>, SinkError> {
    match config {
        SinkConfig::Table(cfg) => {
            let mut sink = TableSink::new(table_store(cfg)?);
            let checkpoint = sink.open()?;
            Ok(Some((Box::new(sink), checkpoint)))
        }
        SinkConfig::Webhook(cfg) => {
            let secret =
                cfg.secret_file.as_deref().map(crate::secrets::webhook_secret).transpose().map_err(operator)?;
            Ok(Some((Box::new(WebhookSink::new(cfg, secret)), None)))
        }
        SinkConfig::Kafka(_)
        | SinkConfig::EventHub(_)
        | SinkConfig::Kinesis(_)
        | SinkConfig::PubSub(_)
        | SinkConfig::Pulsar(_)
        | SinkConfig::Postgres(_) => Ok(None),
    }
}

/// The Kafka config of a sink that speaks Kafka (a Kafka sink, or Event Hubs with its connection
/// string read from its file); `None` for the other types.
pub fn kafka_config_of(config: &SinkConfig) -> Result<Option<KafkaSinkConfig>, SinkError> {
    Ok(match config {
        SinkConfig::Kafka(k) => Some(k.clone()),
        SinkConfig::EventHub(e) => {
            let connection = match &e.connection {
                Connection::Inline(s) => s.clone(),
                Connection::File(path) => crate::secrets::eventhub_connection(path).map_err(operator)?,
            };
            Some(e.kafka_config(&connection))
        }
        SinkConfig::Table(_)
        | SinkConfig::Webhook(_)
        | SinkConfig::Kinesis(_)
        | SinkConfig::PubSub(_)
        | SinkConfig::Pulsar(_)
        | SinkConfig::Postgres(_) => None,
    })
}

/// Spawns `open` on a thread of its own, with every signal blocked.
fn spawn(open: impl FnOnce() -> Result<(Opened, Option<Checkpoint>), SinkError> + Send + 'static) -> Opening {
    with_signals_blocked(move || std::thread::spawn(open))
}

/// Starts opening a sink that does not open in place ([`open_in_place`]) on a thread of its own.
pub fn start_open(config: &SinkConfig, ctx: &OpenContext) -> Result<Opening, SinkError> {
    let interrupt = ctx.interrupt();
    match config {
        SinkConfig::Kinesis(cfg) => {
            let (cfg, defaults) = (cfg.clone(), ctx.settings.kinesis.clone());
            Ok(spawn(move || {
                let mut sink = AwsKinesis::open(&cfg, &defaults)?.into_sink(&cfg);
                sink.set_interrupt(interrupt);
                Ok((Box::new(sink) as Opened, None))
            }))
        }
        SinkConfig::PubSub(cfg) => {
            let (cfg, endpoint) = (cfg.clone(), ctx.settings.pubsub_endpoint.clone());
            Ok(spawn(move || {
                let mut api = GooglePubSub::open(&cfg, endpoint.as_deref())?;
                api.set_interrupt(interrupt);
                Ok((Box::new(api.into_sink(&cfg)) as Opened, None))
            }))
        }
        SinkConfig::Pulsar(cfg) => {
            let (cfg, name, database) = (cfg.clone(), ctx.sink_name.clone(), ctx.database.clone());
            let reuse_names = ctx.settings.pulsar_reuse_producer_name;
            Ok(spawn(move || {
                let mut api = PulsarClient::open(&cfg, &name, reuse_names)?;
                api.set_interrupt(interrupt);
                Ok((Box::new(api.into_sink(&cfg, &database)) as Opened, None))
            }))
        }
        SinkConfig::Postgres(cfg) => {
            let (cfg, pipeline, name) = (cfg.clone(), ctx.pipeline(), ctx.sink_name.clone());
            let (database, sources, shuffle) =
                (ctx.database.clone(), ctx.source_tables.clone(), ctx.settings.apply_shuffle);
            // A sink a role that is not a superuser added: no connection without a password, nor as
            // a superuser of this very server (checked at each connection: pg_hba.conf may change).
            let delegated = ctx.delegated.then(|| ctx.system_identifier.clone());
            Ok(spawn(move || {
                let error = |e: crate::postgres::TargetError| SinkError { class: e.class(), message: e.message };
                let mut conn = Libpq::connect(&cfg.connection, &format!("pg_cdc-{name}"), Duration::from_secs(60))
                    .map_err(error)?;
                if let Some(system) = delegated {
                    conn.check_delegated(&system).map_err(error)?;
                }
                conn.set_interrupt(interrupt);
                let mut sink = PostgresSink::new(conn, &cfg, pipeline, name, database, sources);
                sink.set_shuffle(shuffle);
                let checkpoint = sink.open()?;
                Ok((Box::new(sink) as Opened, checkpoint))
            }))
        }
        SinkConfig::Kafka(_) | SinkConfig::EventHub(_) => {
            let Some(config) = kafka_config_of(config)? else {
                return Err(SinkError { class: ErrorClass::Retry, message: "the sink is not open".into() });
            };
            let transactional = config.exactly_once.then(|| Transactional {
                transactional_id: config.transactional_id.clone().unwrap_or_else(|| ctx.pipeline()),
                progress_topic: crate::kafka::progress_topic(&ctx.slot),
                progress_key: ctx.sink_id.clone(),
                system: ctx.system_identifier.clone(),
            });
            let client_id = format!("pg_cdc-{}", ctx.sink_name);
            let (bootstrap, database) = (ctx.settings.kafka_bootstrap_servers.clone(), ctx.database.clone());
            Ok(spawn(move || {
                let mut p = KafkaSink::new(&config, &bootstrap, &database, &client_id, transactional)?;
                let checkpoint = p.open()?;
                p.set_interrupt(interrupt);
                Ok((Box::new(p) as Opened, checkpoint))
            }))
        }
        SinkConfig::Table(_) | SinkConfig::Webhook(_) => {
            Err(SinkError { class: ErrorClass::Retry, message: "the sink opens in place, not on a thread".into() })
        }
    }
}

/// Deletes what a dropped sink left at its destination: `target`, as `cdc_drop_sink` recorded it
/// (an exactly-once Kafka or Event Hubs sink's progress topic). Whether it was there to delete.
pub fn delete_leftover(
    config: &SinkConfig,
    target: &str,
    default_bootstrap: &str,
    client_id: &str,
    timeout: Duration,
) -> Result<bool, SinkError> {
    match kafka_config_of(config)? {
        Some(k) => crate::kafka::delete_topic(&k, default_bootstrap, client_id, target, timeout),
        None => Err(operator("the sink is not a Kafka or Event Hubs sink".into())),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;

    use super::*;
    use crate::registry::parse_config;

    fn cfg(sink_type: &str, config: serde_json::Value) -> SinkConfig {
        parse_config(sink_type, &config).unwrap()
    }

    /// A store that keeps nothing and counts housekeeping calls.
    struct Counting(std::rc::Rc<std::cell::Cell<u32>>);

    impl EventStore for Counting {
        fn insert(&mut self, _: &[cdc_core::envelope::Event]) -> Result<(), SinkError> {
            Ok(())
        }
        fn save_checkpoint(&mut self, _: Checkpoint) -> Result<(), SinkError> {
            Ok(())
        }
        fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, SinkError> {
            Ok(None)
        }
        fn maintain(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn the_in_database_sink_and_webhooks_open_in_place_the_others_on_a_thread() {
        let maintained = std::rc::Rc::new(std::cell::Cell::new(0));
        let table = cfg("table", json!({"table": "events"}));
        let store = |_: &TableSinkConfig| Ok(Box::new(Counting(maintained.clone())) as Box<dyn EventStore>);
        let (mut sink, checkpoint) = open_in_place(&table, store).unwrap().expect("opened in place");
        assert!(sink.in_source_database() && checkpoint.is_none());
        sink.maintain();
        assert_eq!(maintained.get(), 1, "housekeeping reaches the worker's store");
        let webhook = cfg("webhook", json!({"url": "http://127.0.0.1:1/x"}));
        assert!(open_in_place(&webhook, |_| unreachable!("no store")).unwrap().is_some());
        let threaded = [
            cfg("kafka", json!({"bootstrap_servers": "127.0.0.1:1", "topic": "t"})),
            cfg("kinesis", json!({"stream_name": "s", "region": "us-east-1"})),
            cfg("pubsub", json!({"project": "my-project", "topic": "orders"})),
            cfg("pulsar", json!({"service_url": "pulsar://127.0.0.1:1", "topic": "t"})),
            cfg("postgres", json!({"connection": "host=127.0.0.1 port=1"})),
        ];
        for c in &threaded {
            assert!(open_in_place(c, |_| unreachable!("no store")).unwrap().is_none(), "{c:?}");
        }
        // Negative control: a sink that opens in place has no thread to start.
        assert!(start_open(&table, &OpenContext::default()).is_err());
    }

    #[test]
    fn the_pipeline_is_named_by_cluster_database_and_slot() {
        let ctx = OpenContext {
            slot: "_cdc_0123abcd".into(),
            system_identifier: "7312".into(),
            database_oid: 5,
            ..OpenContext::default()
        };
        assert_eq!(ctx.pipeline(), "pg_cdc-7312-5-0123abcd");
    }

    #[test]
    fn kafka_speakers_get_a_kafka_config_with_the_event_hubs_secret_read_from_its_file() {
        let dir = std::env::temp_dir().join(format!("pg_cdc_open_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hub.conn");
        std::fs::write(&file, "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s\n")
            .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let hub = cfg("eventhub", json!({"namespace": "ns", "eventhub": "orders", "connection_string_file": file}));
        let k = kafka_config_of(&hub).unwrap().expect("a Kafka config");
        assert!(k.properties.get("sasl.password").is_some_and(|p| p.starts_with("Endpoint=sb://")));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = kafka_config_of(&hub).unwrap_err();
        assert!(e.class == ErrorClass::Operator && e.message.contains("group or others"), "{}", e.message);
        let webhook = cfg("webhook", json!({"url": "http://127.0.0.1:1/x"}));
        assert!(kafka_config_of(&webhook).unwrap().is_none());
        assert!(delete_leftover(&webhook, "t", "", "c", Duration::from_millis(1)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
