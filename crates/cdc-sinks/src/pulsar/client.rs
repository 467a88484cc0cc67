//! [`PulsarApi`] with the `pulsar` crate (Apache Pulsar's protocol in Rust, on tokio): a client
//! per sink, a producer per topic opened on first use, each named `<producer_name>-<session>-<n>`
//! (see the module's documentation of [`super`]); a JWT token from the sink's `auth_token_file`.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use pulsar::producer::{Message as PulsarMessage, SendFuture};
use pulsar::{
    Authentication, ConnectionRetryOptions, OperationRetryOptions, Producer, ProducerOptions, Pulsar, TokioExecutor,
};

use super::config::PulsarSinkConfig;
use super::{classify, ApiError, Message, PulsarApi, PulsarSink};
use crate::{ErrorClass, SinkError};

/// Messages a connection queues for the socket before a send waits for room.
const OUTBOUND: usize = 1000;

/// How often a wait looks at the interrupt.
const TICK: Duration = Duration::from_millis(100);

/// A Pulsar client and its producers, on a runtime of its own: one worker thread runs the client's
/// connection tasks (keep-alives, receipts) all along; every call enters the runtime, since the
/// client spawns tasks from inside its calls and its drops.
pub struct PulsarClient {
    rt: tokio::runtime::Runtime,
    /// `None` only while it is dropped (inside the runtime).
    client: Option<Pulsar<TokioExecutor>>,
    producers: HashMap<String, Producer<TokioExecutor>>,
    /// `<producer_name>-<session>`; each producer adds its number.
    name: String,
    opened: u64,
    /// Every producer is named `<producer_name>` alone (the tests' negative control).
    reuse_names: bool,
    /// Receipts not yet waited for.
    pending: Vec<SendFuture>,
    interrupt: Option<Box<dyn Fn() -> bool + Send>>,
}

fn api_error(what: &str, e: &pulsar::Error) -> ApiError {
    let text = e.to_string();
    ApiError { class: classify(&text), message: format!("{what}: {text}") }
}

impl PulsarClient {
    /// Connects to `cfg`'s service URL (the sink `sink_name`'s producers are named after it unless
    /// the config names them). `reuse_names`: every producer is named `<producer_name>` alone, as
    /// a client that reuses a name would (only the tests' negative control asks for it).
    pub fn open(cfg: &PulsarSinkConfig, sink_name: &str, reuse_names: bool) -> Result<PulsarClient, SinkError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("pg_cdc pulsar")
            .enable_all()
            .build()
            .map_err(|e| SinkError {
                class: ErrorClass::Retry,
                message: format!("cannot start the Pulsar client: {e}"),
            })?;
        let token = match &cfg.auth_token_file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| SinkError {
                class: ErrorClass::Operator,
                message: format!("cannot read the Pulsar token file {path}: {e}"),
            })?),
            None => None,
        };
        let url = cfg.service_url.clone();
        let client = rt.block_on(async {
            let mut b = Pulsar::builder(url.clone(), TokioExecutor)
                .with_connection_retry_options(ConnectionRetryOptions {
                    max_retries: 2,
                    connection_timeout: Duration::from_secs(5),
                    ..ConnectionRetryOptions::default()
                })
                .with_outbound_channel_size(OUTBOUND)
                .with_operation_retry_options(OperationRetryOptions {
                    operation_timeout: Duration::from_secs(30),
                    retry_delay: Duration::from_millis(500),
                    max_retries: Some(5),
                });
            if let Some(t) = token {
                b = b.with_auth(Authentication { name: "token".into(), data: t.trim().as_bytes().to_vec() });
            }
            b.build().await
        });
        let client = client.map_err(|e| {
            let a = api_error(&format!("cannot connect to {url}"), &e);
            SinkError { class: a.class, message: format!("Pulsar: {}", a.message) }
        })?;
        let base = cfg.producer_name.clone().unwrap_or_else(|| format!("pg_cdc-{sink_name}"));
        let session =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
        Ok(PulsarClient {
            rt,
            client: Some(client),
            producers: HashMap::new(),
            name: if reuse_names { base } else { format!("{base}-{session}") },
            opened: 0,
            reuse_names,
            pending: Vec::new(),
            interrupt: None,
        })
    }

    /// A check that ends a wait early (the worker's shutdown request): the delivery then fails and
    /// is read again after the restart.
    pub fn set_interrupt(&mut self, f: impl Fn() -> bool + Send + 'static) {
        self.interrupt = Some(Box::new(f));
    }

    /// The sink over this client, for `database`'s events.
    pub fn into_sink(self, cfg: &PulsarSinkConfig, database: &str) -> PulsarSink<PulsarClient> {
        PulsarSink::new(cfg, database, self)
    }

    fn interrupted(&self) -> bool {
        self.interrupt.as_ref().is_some_and(|f| f())
    }
}

impl PulsarApi for PulsarClient {
    fn send(&mut self, message: Message) -> Result<(), ApiError> {
        let _in = self.rt.enter();
        if !self.producers.contains_key(&message.topic) {
            self.opened += 1;
            let name = if self.reuse_names { self.name.clone() } else { format!("{}-{}", self.name, self.opened) };
            let client = self.client.as_ref().expect("dropped only in drop");
            // A full outbound queue makes a send wait for room (the default answers SlowDown).
            let options = ProducerOptions { block_queue_if_full: true, ..ProducerOptions::default() };
            let builder = client.producer().with_topic(message.topic.clone()).with_name(name).with_options(options);
            let producer = self
                .rt
                .block_on(builder.build())
                .map_err(|e| api_error(&format!("cannot open a producer for topic {}", message.topic), &e))?;
            self.producers.insert(message.topic.clone(), producer);
        }
        let Message { topic, payload, key, properties } = message;
        let producer = self.producers.get_mut(&topic).expect("opened above");
        let msg = PulsarMessage {
            payload,
            properties: properties.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ordering_key: key.as_ref().map(|k| k.as_bytes().to_vec()),
            partition_key: key,
            ..Default::default()
        };
        let receipt = self
            .rt
            .block_on(producer.send_non_blocking(msg))
            .map_err(|e| api_error(&format!("cannot send to topic {topic}"), &e))?;
        self.pending.push(receipt);
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), ApiError> {
        let _in = self.rt.enter();
        let deadline = Instant::now() + timeout;
        let pending = std::mem::take(&mut self.pending);
        for mut receipt in pending {
            loop {
                match self.rt.block_on(tokio::time::timeout(TICK, &mut receipt)) {
                    Ok(Ok(_)) => break,
                    Ok(Err(e)) => return Err(api_error("a message was not stored", &e)),
                    Err(_) if self.interrupted() => {
                        return Err(ApiError { class: ErrorClass::Retry, message: "interrupted".into() })
                    }
                    Err(_) if Instant::now() >= deadline => {
                        return Err(ApiError {
                            class: ErrorClass::Retry,
                            message: format!("no receipt from the broker within {} ms", timeout.as_millis()),
                        })
                    }
                    Err(_) => {}
                }
            }
        }
        Ok(())
    }

    fn abandon(&mut self) {
        let _in = self.rt.enter();
        self.pending.clear();
        let producers = std::mem::take(&mut self.producers);
        self.rt.block_on(async {
            for (_, mut p) in producers {
                let _ = tokio::time::timeout(Duration::from_secs(2), p.close()).await;
            }
        });
    }
}

impl Drop for PulsarClient {
    /// Closes the producers and drops the client inside the runtime (their drops spawn tasks).
    fn drop(&mut self) {
        self.abandon();
        let _in = self.rt.enter();
        self.client = None;
    }
}
