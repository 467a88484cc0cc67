//! The Kinesis sink's config.
use cdc_core::config::sink::{parse_common, sink_object, SinkCommon};
use cdc_core::object::invalid;
use cdc_core::CdcResult;
use serde_json::Value;

/// Records per PutRecords request at most (Kinesis' limit).
pub const MAX_REQUEST_RECORDS: usize = 500;
/// Bytes (data + partition keys) per PutRecords request at most (Kinesis' limit).
pub const MAX_REQUEST_BYTES: usize = 10 << 20;
/// Bytes of one record (data + partition key) at most (Kinesis' limit).
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// A validated Kinesis sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KinesisSinkConfig {
    /// The keys every sink takes (tables, format, partition key, ...).
    pub common: SinkCommon,
    /// The data stream every event goes to.
    pub stream_name: String,
    /// AWS region; `None`: the server's `cdc.aws_region`, else the AWS default chain (`AWS_REGION`,
    /// the profile's `region`).
    pub region: Option<String>,
    /// Endpoint URL; `None`: the server's `cdc.kinesis_endpoint`, else `AWS_ENDPOINT_URL_KINESIS`
    /// / `AWS_ENDPOINT_URL`, else the region's Kinesis endpoint.
    pub endpoint: Option<String>,
    /// Named profile of the server user's shared AWS config and credentials files.
    pub profile: Option<String>,
    /// Records per PutRecords request at most.
    pub batch_max_records: usize,
    /// Bytes per PutRecords request at most.
    pub batch_max_bytes: usize,
    /// How long one request may take, in milliseconds.
    pub timeout_ms: u64,
    /// How long records throttled or failed by Kinesis are retried in place (without progress)
    /// before the delivery fails and is read again, in milliseconds.
    pub retry_timeout_ms: u64,
}

/// The Kinesis sink's own keys (besides [`COMMON_KEYS`](cdc_core::config::sink::COMMON_KEYS)).
pub const KEYS: &[&str] = &[
    "stream_name",
    "region",
    "endpoint",
    "profile",
    "batch_max_records",
    "batch_max_bytes",
    "timeout_ms",
    "retry_timeout_ms",
    "exactly_once",
];

/// Whether `name` is a valid Kinesis stream name (1-128 of `a-zA-Z0-9_.-`).
pub fn is_stream_name(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// Whether `region` looks like an AWS region name (`us-east-1`, `eu-central-2`, `cn-north-1`).
pub fn is_region(region: &str) -> bool {
    !region.is_empty()
        && region.len() <= 64
        && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !region.starts_with('-')
        && !region.ends_with('-')
}

/// Whether `url` is an `http://` or `https://` URL with a host.
pub fn is_endpoint(url: &str) -> bool {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/')) && !url.chars().any(char::is_whitespace)
}

/// Parses and validates a Kinesis sink config.
pub fn parse(config: &Value) -> CdcResult<KinesisSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let stream_name = o
        .string("stream_name")?
        .ok_or_else(|| {
            invalid("config.stream_name is required for a Kinesis sink")
                .hint("Add \"stream_name\": \"orders-changes\" (the data stream must exist).")
        })?
        .to_string();
    if !is_stream_name(&stream_name) {
        return Err(invalid(format!("config.stream_name \"{stream_name}\" is not a valid Kinesis stream name"))
            .hint("1 to 128 characters: letters, digits, '_', '.', '-'."));
    }
    let region = o.string("region")?.map(str::to_string);
    if let Some(r) = region.as_deref().filter(|r| !is_region(r)) {
        return Err(
            invalid(format!("config.region \"{r}\" is not an AWS region name")).hint("For example \"us-east-1\".")
        );
    }
    let endpoint = o.string("endpoint")?.map(str::to_string);
    if endpoint.as_deref().is_some_and(|e| !is_endpoint(e)) {
        return Err(invalid("config.endpoint must be an http:// or https:// URL with a host")
            .hint("For example \"https://kinesis.us-east-1.amazonaws.com\" or a VPC endpoint's URL."));
    }
    let profile = o.string("profile")?.map(str::to_string);
    if profile.as_deref().is_some_and(|p| p.is_empty() || p.chars().any(|c| c.is_whitespace() || c.is_control())) {
        return Err(invalid("config.profile must be a profile name of the AWS config files"));
    }
    if o.bool("exactly_once")? == Some(true) {
        return Err(invalid("config.exactly_once: a Kinesis sink is at-least-once").hint(
            "Kinesis has no transactions: after a failure the unacknowledged records are sent again; \
             (metadata.commit_lsn, metadata.lsn) identifies an event.",
        ));
    }
    let common = parse_common(&o)?;
    let batch_max_records =
        o.int("batch_max_records", 1, MAX_REQUEST_RECORDS as i64)?.unwrap_or(MAX_REQUEST_RECORDS as i64) as usize;
    let batch_max_bytes =
        o.int("batch_max_bytes", MAX_RECORD_BYTES as i64, MAX_REQUEST_BYTES as i64)?.unwrap_or(5 << 20) as usize;
    let timeout_ms = o.int("timeout_ms", 100, 600_000)?.unwrap_or(10_000) as u64;
    let retry_timeout_ms = o.int("retry_timeout_ms", 0, 3_600_000)?.unwrap_or(30_000) as u64;
    Ok(KinesisSinkConfig {
        common,
        stream_name,
        region,
        endpoint,
        profile,
        batch_max_records,
        batch_max_bytes,
        timeout_ms,
        retry_timeout_ms,
    })
}
