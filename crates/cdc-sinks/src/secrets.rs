//! The secret files a sink config names (a webhook's `secret_file`, an Event Hubs
//! `connection_string_file`): read when the sink is added (to refuse a bad one at once) and when
//! it opens. A relative path is relative to the data directory (the server's working directory).
use std::os::unix::fs::PermissionsExt;

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
