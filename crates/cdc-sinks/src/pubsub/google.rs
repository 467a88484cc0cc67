//! [`PubSubApi`] with Google's Cloud Client Library for Rust (`google-cloud-pubsub`): its
//! publisher batches each ordering key's messages and sends a key's next batch once the one before
//! is acknowledged; credentials are found the usual Google ways (Application Default Credentials),
//! or read from the sink's `credentials_file`; an `http://` endpoint is an emulator, reached with no
//! credentials, as Google's clients reach `PUBSUB_EMULATOR_HOST`.
use std::collections::BTreeSet;
use std::time::Duration;

use google_cloud_pubsub::client::{BasePublisher, Publisher};
use google_cloud_pubsub::error::PublishError;
use google_cloud_pubsub::publisher::PublishFuture;

use super::config::{PubSubSinkConfig, MAX_REQUEST_MESSAGES};
use super::{classify_code, ApiError, Message, PubSubApi, PubSubSink};
use crate::{ErrorClass, SinkError};

/// How often a wait looks at the interrupt.
const TICK: Duration = Duration::from_millis(100);

/// Google's publisher for one topic, on a runtime of its own (driven while the sink waits).
pub struct GooglePubSub {
    rt: tokio::runtime::Runtime,
    publisher: Publisher,
    /// Messages handed over and not yet waited for: their ordering keys and results.
    pending: Vec<(String, PublishFuture)>,
    interrupt: Option<Box<dyn Fn() -> bool + Send>>,
}

fn operator(message: impl Into<String>) -> SinkError {
    SinkError { class: ErrorClass::Operator, message: message.into() }
}

/// What a failed call means.
fn api_error(e: &google_cloud_pubsub::Error) -> ApiError {
    if let Some(status) = e.status() {
        let code = format!("{:?}", status.code);
        let what = if code == "NotFound" { "the topic does not exist: " } else { "" };
        return ApiError { class: classify_code(&code), message: format!("{what}{code}: {}", status.message) };
    }
    let class = if e.is_authentication() { ErrorClass::Operator } else { ErrorClass::Retry };
    ApiError { class, message: e.to_string() }
}

/// The credentials of a sink: none for an emulator (an `http://` endpoint), the sink's file, or
/// Application Default Credentials.
fn credentials(
    cfg: &PubSubSinkConfig,
    endpoint: Option<&str>,
) -> Result<google_cloud_auth::credentials::Credentials, SinkError> {
    use google_cloud_auth::credentials::{anonymous, external_account, service_account, user_account, Builder};
    if endpoint.is_some_and(|e| e.starts_with("http://")) {
        return Ok(anonymous::Builder::new().build());
    }
    let built = match &cfg.credentials_file {
        None => Builder::default().build(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| operator(format!("cannot read the credentials file {path}: {e}")))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|_| operator(format!("the credentials file {path} is not JSON")))?;
            match json.get("type").and_then(|t| t.as_str()) {
                Some("service_account") => service_account::Builder::new(json).build(),
                Some("external_account") => external_account::Builder::new(json).build(),
                Some("authorized_user") => user_account::Builder::new(json).build(),
                other => {
                    return Err(operator(format!(
                        "the credentials file {path} has type {other:?}: pg_cdc reads service_account, \
                         external_account and authorized_user files"
                    )))
                }
            }
        }
    };
    built.map_err(|e| {
        operator(format!(
            "no Google credentials{}: {e}",
            cfg.credentials_file.as_deref().map(|p| format!(" in {p}")).unwrap_or_else(|| {
                " found the usual ways (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default \
                 credentials, the metadata server)"
                    .into()
            })
        ))
    })
}

impl GooglePubSub {
    /// Opens a publisher for `cfg`'s topic at its endpoint (else `default_endpoint`, the server's
    /// `cdc.pubsub_endpoint`, else Google's).
    pub fn open(cfg: &PubSubSinkConfig, default_endpoint: Option<&str>) -> Result<GooglePubSub, SinkError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| SinkError {
            class: ErrorClass::Retry,
            message: format!("cannot start the Pub/Sub client: {e}"),
        })?;
        let nonempty = |s: Option<&str>| s.map(str::trim).filter(|s| !s.is_empty()).map(str::to_string);
        let endpoint = nonempty(cfg.endpoint.as_deref()).or_else(|| nonempty(default_endpoint));
        let creds = credentials(cfg, endpoint.as_deref())?;
        let topic = cfg.topic_path();
        let prefix = |m: String| format!("Pub/Sub topic \"{topic}\": {m}");
        // The topic is not looked up first: Google's admin client speaks REST, which an emulator may
        // not serve; a missing topic fails the first publish (NotFound, an operator error).
        let publisher = rt.block_on(async {
            let mut base = BasePublisher::builder().with_credentials(creds);
            if let Some(e) = &endpoint {
                base = base.with_endpoint(e);
            }
            let base = base.build().await.map_err(|e| operator(prefix(format!("cannot build the publisher: {e}"))))?;
            Ok::<_, SinkError>(base.publisher(&topic).set_message_count_threshold(MAX_REQUEST_MESSAGES as u32).build())
        })?;
        Ok(GooglePubSub { rt, publisher, pending: Vec::new(), interrupt: None })
    }

    /// A check that ends a wait early (the worker's shutdown request): the delivery then fails and
    /// is read again after the restart.
    pub fn set_interrupt(&mut self, f: impl Fn() -> bool + Send + 'static) {
        self.interrupt = Some(Box::new(f));
    }

    /// The sink over this publisher.
    pub fn into_sink(self, cfg: &PubSubSinkConfig) -> PubSubSink<GooglePubSub> {
        PubSubSink::new(cfg, self)
    }

    /// Accepts every ordering key again.
    fn resume(&mut self, keys: BTreeSet<String>) {
        for k in keys.into_iter().filter(|k| !k.is_empty()) {
            self.publisher.resume_publish(k);
        }
    }
}

impl PubSubApi for GooglePubSub {
    fn publish(&mut self, m: Message) {
        let msg = google_cloud_pubsub::model::Message::new()
            .set_data(m.data)
            .set_ordering_key(m.ordering_key.clone())
            .set_attributes(m.attributes);
        let future = self.publisher.publish(msg);
        self.pending.push((m.ordering_key, future));
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), ApiError> {
        let pending = std::mem::take(&mut self.pending);
        let keys: BTreeSet<String> = pending.iter().map(|(k, _)| k.clone()).collect();
        let interrupt = self.interrupt.as_deref();
        let results = self.rt.block_on(async {
            let all = async move {
                let (mut first, mut paused): (Option<ApiError>, bool) = (None, false);
                for (_, f) in pending {
                    match f.await {
                        Ok(_) => {}
                        Err(PublishError::Rpc(e)) => {
                            first.get_or_insert_with(|| api_error(&e));
                        }
                        // A message of its key failed before it (that one is the cause when it is
                        // among these), or in a delivery abandoned since: not published.
                        Err(PublishError::OrderingKeyPaused) => paused = true,
                        Err(e) => {
                            first.get_or_insert_with(|| ApiError { class: ErrorClass::Retry, message: e.to_string() });
                        }
                    }
                }
                match (first, paused) {
                    (Some(e), _) => Err(e),
                    (None, true) => Err(ApiError {
                        class: ErrorClass::Retry,
                        message: "publishing was paused for an ordering key after an earlier failure".into(),
                    }),
                    (None, false) => Ok(()),
                }
            };
            let deadline = tokio::time::Instant::now() + timeout;
            let mut all = std::pin::pin!(all);
            loop {
                let slice = deadline.saturating_duration_since(tokio::time::Instant::now()).min(TICK);
                if let Ok(r) = tokio::time::timeout(slice, &mut all).await {
                    break r;
                }
                let message = if interrupt.is_some_and(|f| f()) {
                    "interrupted while waiting for acknowledgements".to_string()
                } else if tokio::time::Instant::now() >= deadline {
                    format!("messages not acknowledged within {} ms", timeout.as_millis())
                } else {
                    continue;
                };
                break Err(ApiError { class: ErrorClass::Retry, message });
            }
        });
        if results.is_err() {
            // The keys that failed are paused: the delivery is read again from its start.
            self.resume(keys);
        }
        results
    }

    fn abandon(&mut self) {
        let keys: BTreeSet<String> = self.pending.drain(..).map(|(k, _)| k).collect();
        self.resume(keys);
    }
}
