//! The secret files a sink config names (a webhook's `secret_file`, an Event Hubs
//! `connection_string_file`): read when the sink is added (to refuse a bad one at once) and when
//! it opens. A relative path is relative to the data directory (the server's working directory).
use std::os::unix::fs::PermissionsExt;

use crate::eventhub::config::Connection;
use crate::SinkConfig;

/// Reads a file holding a secret (`what` names it in messages; a relative path is relative to the
/// data directory): a regular file that neither group nor others can read. Errors name the file and
/// the problem, never its contents.
pub fn read_secret_file(what: &str, path: &str) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the {what} \"{path}\": {e}"))?;
    if !meta.is_file() {
        return Err(format!("the {what} \"{path}\" is not a regular file"));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "the {what} \"{path}\" can be read by group or others; it must be mode 0600 or 0400 (chmod 600)"
        ));
    }
    std::fs::read(path).map_err(|e| format!("cannot read the {what} \"{path}\": {e}"))
}

/// The secret of a webhook sink's `secret_file`: its content without trailing whitespace (so a file
/// written with `echo` works); an empty one is refused.
pub fn webhook_secret(path: &str) -> Result<Vec<u8>, String> {
    let mut bytes = read_secret_file("webhook secret file", path)?;
    while bytes.last().is_some_and(u8::is_ascii_whitespace) {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(format!("the webhook secret file \"{path}\" is empty"));
    }
    Ok(bytes)
}

/// The connection string of an Event Hubs sink's `connection_string_file`, checked for its shape
/// (errors name the file and what is missing, never the content).
pub fn eventhub_connection(path: &str) -> Result<String, String> {
    let bytes = read_secret_file("Event Hubs connection string file", path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("the Event Hubs connection string file \"{path}\" is not text"))?;
    crate::eventhub::config::check_connection_string(&text)
        .map_err(|why| format!("the Event Hubs connection string file \"{path}\" holds no connection string: {why}"))?;
    Ok(text.trim().to_string())
}

/// A secret file a sink config names that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    /// The config key that names it.
    pub key: &'static str,
    /// What it holds, for the hint.
    pub what: &'static str,
    /// Why (names the file and the problem, never its contents).
    pub error: String,
}

/// Reads the secret files `cfg` names, as its sink will when it opens: a sink whose file cannot be
/// used is refused when it is added instead of failing later.
pub fn check_files(cfg: &SinkConfig) -> Result<(), Unusable> {
    match cfg {
        SinkConfig::Webhook(w) => {
            if let Some(path) = &w.secret_file {
                webhook_secret(path).map_err(|error| Unusable { key: "secret_file", what: "the secret", error })?;
            }
        }
        SinkConfig::EventHub(e) => {
            if let Connection::File(path) = &e.connection {
                eventhub_connection(path).map_err(|error| Unusable {
                    key: "connection_string_file",
                    what: "the connection string",
                    error,
                })?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::parse_config;

    fn webhook(secret_file: &str) -> SinkConfig {
        let cfg = serde_json::json!({"url": "http://127.0.0.1:1/hook", "secret_file": secret_file});
        parse_config("webhook", &cfg).unwrap()
    }

    #[test]
    fn a_secret_file_that_cannot_be_used_is_named_by_its_key_and_one_that_can_passes() {
        let dir = std::env::temp_dir().join(format!("pg_cdc_secrets_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "s3cr3t\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = check_files(&webhook(path.to_str().unwrap())).unwrap_err();
        assert_eq!((err.key, err.what), ("secret_file", "the secret"));
        assert!(err.error.contains("mode 0600") && !err.error.contains("s3cr3t"), "{}", err.error);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(check_files(&webhook(path.to_str().unwrap())), Ok(()));
        let missing = check_files(&webhook(dir.join("none").to_str().unwrap())).unwrap_err();
        assert!(missing.error.contains("cannot read"), "{}", missing.error);
        // A sink that names no secret file has nothing to check.
        let kafka = parse_config("kafka", &serde_json::json!({"topic": "t"})).unwrap();
        assert_eq!(check_files(&kafka), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
