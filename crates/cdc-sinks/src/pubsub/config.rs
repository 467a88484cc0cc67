//! The Pub/Sub sink's config.
use cdc_core::config::sink::{parse_common, sink_object, SinkCommon};
use cdc_core::object::invalid;
use cdc_core::CdcResult;
use serde_json::Value;

use crate::kinesis::config::is_endpoint;

/// Messages per Publish request at most (Pub/Sub's limit).
pub const MAX_REQUEST_MESSAGES: usize = 1000;
/// Bytes of one message's data at most: Pub/Sub takes 10 MB a message, attributes and ordering key
/// included; pg_cdc keeps 64 KiB of that for them.
pub const MAX_MESSAGE_BYTES: usize = 10_000_000 - (64 << 10);

/// A validated Pub/Sub sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubSubSinkConfig {
    /// The keys every sink takes (tables, format, partition key, ...).
    pub common: SinkCommon,
    /// The Google Cloud project of the topic.
    pub project: String,
    /// The topic every event goes to (its short name, or `projects/<p>/topics/<t>`).
    pub topic: String,
    /// Endpoint URL; `None`: the server's `cdc.pubsub_endpoint`, else Google's
    /// (`https://pubsub.googleapis.com`). An `http://` endpoint is an emulator: no credentials.
    pub endpoint: Option<String>,
    /// A credentials file (a service account key, or any file Application Default Credentials
    /// takes); `None`: Application Default Credentials, found the usual Google ways.
    pub credentials_file: Option<String>,
    /// How long a delivery may wait for Pub/Sub's acknowledgements, in milliseconds.
    pub timeout_ms: u64,
    /// Messages handed to the publisher and not yet acknowledged at most, before the sink waits.
    pub max_outstanding_messages: usize,
}

/// The Pub/Sub sink's own keys (besides [`COMMON_KEYS`](cdc_core::config::sink::COMMON_KEYS)).
pub const KEYS: &[&str] =
    &["project", "topic", "endpoint", "credentials_file", "timeout_ms", "max_outstanding_messages", "exactly_once"];

/// Whether `id` is a Google Cloud project id: 6 to 30 of lowercase letters, digits and `-`,
/// starting with a letter and not ending with `-`; a domain-scoped one (`example.com:my-project`)
/// has its domain before a colon.
pub fn is_project_id(id: &str) -> bool {
    let (domain, name) = match id.rsplit_once(':') {
        Some((d, n)) => (Some(d), n),
        None => (None, id),
    };
    let name_ok = (6..=30).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let domain_ok = domain.is_none_or(|d| {
        !d.is_empty()
            && d.len() <= 253
            && d.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-".contains(c))
    });
    name_ok && domain_ok
}

/// Whether `name` is a Pub/Sub topic id: 3 to 255 of letters, digits and `-_.~+%`, starting with a
/// letter, not starting with `goog`.
pub fn is_topic_id(name: &str) -> bool {
    (3..=255).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && !name.to_ascii_lowercase().starts_with("goog")
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.~+%".contains(c))
}

impl PubSubSinkConfig {
    /// The topic's full name, `projects/<project>/topics/<topic>`.
    pub fn topic_path(&self) -> String {
        format!("projects/{}/topics/{}", self.project, self.topic)
    }
}

/// Parses and validates a Pub/Sub sink config.
pub fn parse(config: &Value) -> CdcResult<PubSubSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let topic_given = o
        .string("topic")?
        .ok_or_else(|| {
            invalid("config.topic is required for a Pub/Sub sink")
                .hint("Add \"topic\": \"orders-changes\" (the topic must exist) and \"project\".")
        })?
        .to_string();
    // A full name carries its project.
    let (project_in_topic, topic) = match topic_given.strip_prefix("projects/").and_then(|r| r.split_once("/topics/")) {
        Some((p, t)) => (Some(p.to_string()), t.to_string()),
        None => (None, topic_given.clone()),
    };
    let project = match (o.string("project")?.map(str::to_string), project_in_topic) {
        (Some(p), Some(q)) if p != q => {
            return Err(invalid(format!(
                "config.project \"{p}\" differs from the project of config.topic \"{topic_given}\""
            ))
            .hint("Give the topic's short name with \"project\", or its full name alone."))
        }
        (Some(p), _) | (None, Some(p)) => p,
        (None, None) => {
            return Err(invalid("config.project is required for a Pub/Sub sink")
                .hint("Add \"project\": \"my-project\", or give \"topic\" as projects/<project>/topics/<topic>."))
        }
    };
    if !is_project_id(&project) {
        return Err(invalid(format!("config.project \"{project}\" is not a Google Cloud project id"))
            .hint("6 to 30 lowercase letters, digits or '-', starting with a letter."));
    }
    if !is_topic_id(&topic) {
        return Err(invalid(format!("config.topic \"{topic}\" is not a valid Pub/Sub topic name")).hint(
            "3 to 255 characters: letters, digits, '-', '_', '.', '~', '+', '%'; starting with a letter, not with \"goog\".",
        ));
    }
    let endpoint = o.string("endpoint")?.map(str::to_string);
    if endpoint.as_deref().is_some_and(|e| !is_endpoint(e)) {
        return Err(invalid("config.endpoint must be an http:// or https:// URL with a host")
            .hint("For example \"https://europe-west1-pubsub.googleapis.com\" (a locational endpoint)."));
    }
    let credentials_file = o.string("credentials_file")?.map(str::to_string);
    if credentials_file.as_deref().is_some_and(|p| !p.starts_with('/')) {
        return Err(invalid("config.credentials_file must be an absolute path")
            .hint("A file the server's operating system user can read, e.g. /etc/pg_cdc/pubsub-sa.json."));
    }
    if o.bool("exactly_once")? == Some(true) {
        return Err(invalid("config.exactly_once: a Pub/Sub sink is at-least-once").hint(
            "Pub/Sub has no transactions: after a failure the unacknowledged messages are published again; \
             the message attribute \"id\" (<commit_lsn>-<event_index>) identifies an event.",
        ));
    }
    let common = parse_common(&o)?;
    let timeout_ms = o.int("timeout_ms", 100, 600_000)?.unwrap_or(30_000) as u64;
    let max_outstanding_messages = o.int("max_outstanding_messages", 1, 1_000_000)?.unwrap_or(10_000) as usize;
    Ok(PubSubSinkConfig { common, project, topic, endpoint, credentials_file, timeout_ms, max_outstanding_messages })
}
