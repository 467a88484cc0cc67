//! [`KinesisApi`] with the AWS SDK for Rust: region, endpoint and credentials found the usual AWS
//! ways, TLS with rustls (ring) and the system's CA store, the SDK's own retries off (the sink
//! retries failed records itself, in key order).
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use aws_smithy_http_client::tls;

use super::config::KinesisSinkConfig;
use super::{classify_code, ApiError, Entry, KinesisApi, KinesisSink, RecordError};
use crate::kafka::with_signals_blocked;
use crate::{ErrorClass, SinkError};

/// What the server's settings give a config that omits them (`cdc.aws_region`,
/// `cdc.kinesis_endpoint`); empty strings count as unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    /// Region when the config has none.
    pub region: Option<String>,
    /// Endpoint URL when the config has none.
    pub endpoint: Option<String>,
}

/// The Kinesis client of one sink: a single-threaded Tokio runtime the calls block on.
pub struct AwsKinesis {
    rt: tokio::runtime::Runtime,
    client: aws_sdk_kinesis::Client,
    stream: String,
}

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn operator(message: impl Into<String>) -> SinkError {
    SinkError { class: ErrorClass::Operator, message: message.into() }
}

/// The class and message of a failed SDK call.
fn api_error<E: ProvideErrorMetadata + std::error::Error + 'static>(e: SdkError<E>) -> ApiError {
    match &e {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("").to_string();
            let message = se.err().message().unwrap_or("").to_string();
            let status = se.raw().status().as_u16();
            let class = if code.is_empty() && (400..500).contains(&status) && status != 429 && status != 408 {
                ErrorClass::Operator
            } else {
                classify_code(&code)
            };
            let code = if code.is_empty() { format!("HTTP {status}") } else { code };
            ApiError { class, answered: true, message: format!("{code}: {message}") }
        }
        SdkError::TimeoutError(_) => {
            ApiError { class: ErrorClass::Retry, answered: false, message: "the request timed out".into() }
        }
        SdkError::DispatchFailure(d) if d.is_user() => {
            ApiError { class: ErrorClass::Operator, answered: false, message: format!("{}", DisplayErrorContext(&e)) }
        }
        SdkError::ConstructionFailure(_) => {
            ApiError { class: ErrorClass::Operator, answered: false, message: format!("{}", DisplayErrorContext(&e)) }
        }
        _ => ApiError { class: ErrorClass::Retry, answered: false, message: format!("{}", DisplayErrorContext(&e)) },
    }
}

impl AwsKinesis {
    /// Finds region, endpoint and credentials, and checks that the stream exists. Blocks (up to a
    /// few seconds when the credential chain has to ask an instance metadata service that is not
    /// there): the worker calls it on its own thread.
    pub fn open(cfg: &KinesisSinkConfig, defaults: &Defaults) -> Result<AwsKinesis, SinkError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| SinkError {
            class: ErrorClass::Retry,
            message: format!("cannot start the Kinesis client: {e}"),
        })?;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_timeout(Duration::from_millis(cfg.timeout_ms))
                    .build(),
            );
        if let Some(p) = &cfg.profile {
            loader = loader.profile_name(p);
        }
        let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
        if let Some(r) = nonempty(&cfg.region).or_else(|| nonempty(&defaults.region)) {
            loader = loader.region(Region::new(r));
        }
        if let Some(e) = nonempty(&cfg.endpoint).or_else(|| nonempty(&defaults.endpoint)) {
            loader = loader.endpoint_url(e);
        }
        let stream = cfg.stream_name.clone();
        let checked: Result<aws_sdk_kinesis::Client, SinkError> = with_signals_blocked(|| {
            rt.block_on(async {
                let conf = loader.load().await;
                let Some(region) = conf.region().map(|r| r.to_string()) else {
                    return Err(operator(
                        "no AWS region: set the sink's \"region\", the server setting cdc.aws_region, or AWS_REGION",
                    ));
                };
                let Some(provider) = conf.credentials_provider() else {
                    return Err(operator("no AWS credentials provider"));
                };
                use aws_credential_types::provider::ProvideCredentials;
                if let Err(e) = provider.provide_credentials().await {
                    return Err(operator(format!(
                        "no AWS credentials found the usual ways (environment, shared config and credentials files{}, web identity, container or instance metadata): {}",
                        cfg.profile.as_deref().map(|p| format!(", profile \"{p}\"")).unwrap_or_default(),
                        DisplayErrorContext(&e)
                    )));
                }
                let client = aws_sdk_kinesis::Client::new(&conf);
                match client.describe_stream_summary().stream_name(&stream).send().await {
                    Ok(_) => Ok(client),
                    Err(e) => {
                        let e = api_error(e);
                        if e.message.starts_with("ResourceNotFoundException") {
                            Err(operator(format!("the stream does not exist in region {region} ({})", e.message)))
                        } else if e.message.starts_with("AccessDenied") {
                            // Allowed to put records but not to describe the stream: PutRecords tells.
                            Ok(client)
                        } else {
                            Err(SinkError { class: e.class, message: e.message })
                        }
                    }
                }
            })
        });
        let client = checked.map_err(|e| SinkError {
            class: e.class,
            message: format!("Kinesis stream \"{stream}\": {}", e.message),
        })?;
        Ok(AwsKinesis { rt, client, stream })
    }

    /// A sink for `cfg` over this client.
    pub fn into_sink(self, cfg: &KinesisSinkConfig) -> KinesisSink<AwsKinesis> {
        KinesisSink::new(cfg, self)
    }
}

impl KinesisApi for AwsKinesis {
    fn put_records(&mut self, records: &[&Entry]) -> Result<Vec<Option<RecordError>>, ApiError> {
        let entries: Vec<PutRecordsRequestEntry> = records
            .iter()
            .map(|e| {
                PutRecordsRequestEntry::builder()
                    .data(Blob::new(e.data.clone()))
                    .partition_key(e.partition_key.clone())
                    .build()
                    .expect("data and partition key are set")
            })
            .collect();
        let request = self.client.put_records().stream_name(&self.stream).set_records(Some(entries));
        let output = with_signals_blocked(|| self.rt.block_on(request.send()).map_err(api_error))?;
        Ok(output
            .records()
            .iter()
            .map(|r| {
                r.error_code().map(|code| RecordError {
                    code: code.to_string(),
                    message: r.error_message().unwrap_or("").to_string(),
                })
            })
            .collect())
    }
}
