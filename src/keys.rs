//! The two secrets pg_cdc uses, both kept in files and never in settings (PostgreSQL logs
//! settings when they change), the catalog, the stream or an error message:
//! - the tokenization key: the file `cdc.tokenization_key_file` names (the DBA's; like
//!   `ssl_key_file`, a relative path is relative to the data directory), else `pg_cdc_token.key`
//!   in the data directory when it exists (what `cdc_create_tokenization_key()` writes). A file
//!   that group or others can read is refused;
//! - the context key that seals user context messages ([`cdc_core::context`]), made by pg_cdc
//!   itself: `pg_cdc_context.key` in the data directory, 32 random bytes, created on first use.
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use cdc_core::redact::TokenKey;
use cdc_core::{CdcError, ErrorKind};

use crate::gucs;

/// The tokenization key file used when `cdc.tokenization_key_file` is not set, relative to the
/// data directory (every backend's working directory).
pub const DEFAULT_TOKEN_KEY_FILE: &str = "pg_cdc_token.key";

/// Which tokenization key file is in force and what it looked like: compare two of them to know
/// when to load again (a changed setting, a key file created, replaced or removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySource {
    /// The file: the setting, else [`DEFAULT_TOKEN_KEY_FILE`]; empty when neither is there.
    pub path: String,
    /// `cdc.tokenization_key_version`.
    pub version: u32,
    /// What the file looked like, `None` when it cannot be read.
    stamp: Option<FileStamp>,
}

/// (device, inode, size, modification time, change time) of a file: any write, replacement or
/// chmod changes one of them.
type FileStamp = (u64, u64, u64, (i64, i64), (i64, i64));

/// The key source now: the setting's file, else the default file when it exists.
pub fn settings() -> KeySource {
    let version = gucs::TOKENIZATION_KEY_VERSION.get().max(1) as u32;
    let set = gucs::string(&gucs::TOKENIZATION_KEY_FILE);
    let path = if !set.is_empty() {
        set
    } else if std::fs::symlink_metadata(DEFAULT_TOKEN_KEY_FILE).is_ok() {
        DEFAULT_TOKEN_KEY_FILE.to_string()
    } else {
        String::new()
    };
    let stamp = (!path.is_empty())
        .then(|| std::fs::metadata(&path).ok())
        .flatten()
        .map(|m| (m.dev(), m.ino(), m.size(), (m.mtime(), m.mtime_nsec()), (m.ctime(), m.ctime_nsec())));
    KeySource { path, version, stamp }
}

/// Loads the key the source names: `Ok(None)` when there is none. Errors name the file and the
/// problem, never its contents.
pub fn load(source: &KeySource) -> Result<Option<TokenKey>, String> {
    let path = &source.path;
    if path.is_empty() {
        return Ok(None);
    }
    let bytes = read_secret_file("tokenization key file", path)?;
    TokenKey::parse(&bytes, source.version)
        .map(Some)
        .map_err(|e| format!("tokenization key file \"{path}\": {}", e.message))
}

pub use cdc_sinks::secrets::{eventhub_connection, read_secret_file, webhook_secret};

/// Refuses (55000) to configure `what` when no usable tokenization key is in force: a table whose
/// events tokenize must never stop a sink (and every other table it carries) afterwards.
pub fn require_token_key(what: &str) {
    let problem = match load(&settings()) {
        Ok(Some(_)) => return,
        Ok(None) => "no tokenization key is configured".to_string(),
        Err(e) => e,
    };
    crate::errors::raise(
        CdcError::new(ErrorKind::PrerequisiteState, format!("{what} tokenizes columns, but {problem}"))
            .detail("Tokens are keyed; without a key pg_cdc would have to stop the sinks that carry the table.")
            .hint(
                "Run SELECT cdc_create_tokenization_key(); once (a random key in the data directory, used without \
                 any setting), or point cdc.tokenization_key_file at your own key file (mode 0600) and SELECT \
                 pg_reload_conf(); then try again.",
            ),
    );
}

/// Writes `bytes` to `name` (relative to the data directory) with mode 0600, only if it does not
/// exist yet: each caller writes its own temporary file and links it into place, so when two race
/// exactly one wins. Returns false when the file already existed.
fn create_secret_file(name: &str, bytes: &[u8]) -> Result<bool, String> {
    let tmp = format!("{name}.{}", std::process::id());
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()));
    let linked = made.and_then(|_| std::fs::hard_link(&tmp, name));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(format!("cannot create the file \"{name}\" in the data directory: {e}")),
    }
}

/// 32 bytes from PostgreSQL's strong random source.
fn random_key() -> Result<[u8; 32], String> {
    let mut key = [0u8; 32];
    // SAFETY: pg_strong_random writes exactly `len` bytes into the buffer it is given.
    if !unsafe { pgrx::pg_sys::pg_strong_random(key.as_mut_ptr().cast(), key.len()) } {
        return Err("no strong random source".into());
    }
    Ok(key)
}

/// Creates the default tokenization key file (64 hex digits, mode 0600) in the data directory.
/// Refuses when one exists already (a key that changes changes every token).
pub fn create_token_key() -> Result<(), String> {
    let key = random_key().map_err(|e| format!("cannot make a tokenization key: {e}"))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    match create_secret_file(DEFAULT_TOKEN_KEY_FILE, format!("{hex}\n").as_bytes())? {
        true => Ok(()),
        false => Err(format!("the tokenization key file \"{DEFAULT_TOKEN_KEY_FILE}\" already exists")),
    }
}

/// The context key file, relative to the data directory (every backend's working directory).
const CONTEXT_KEY_FILE: &str = "pg_cdc_context.key";

/// The context key, created on first use (two backends may race: exactly one file wins and both
/// read the winner).
pub fn context_key() -> Result<Vec<u8>, String> {
    match std::fs::read(CONTEXT_KEY_FILE) {
        Ok(k) if k.len() == 32 => return Ok(k),
        Ok(_) => return Err(format!("the context key file \"{CONTEXT_KEY_FILE}\" in the data directory is damaged")),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot read the context key file \"{CONTEXT_KEY_FILE}\": {e}"))
        }
        Err(_) => {}
    }
    let key = random_key().map_err(|e| format!("cannot make the context key: {e}"))?;
    if create_secret_file(CONTEXT_KEY_FILE, &key)? {
        Ok(key.to_vec())
    } else {
        std::fs::read(CONTEXT_KEY_FILE).map_err(|e| format!("cannot read the context key file: {e}"))
    }
}
