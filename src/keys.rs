//! The two secrets pg_cdc uses, both kept in files and never in settings (PostgreSQL logs
//! settings when they change), the catalog, the stream or an error message:
//! - the tokenization key, from the file `cdc.tokenization_key_file` names (the DBA's; like
//!   `ssl_key_file`, a relative path is relative to the data directory, and a file that group or
//!   others can read is refused);
//! - the context key that seals user context messages ([`cdc_core::context`]), made by pg_cdc
//!   itself: `pg_cdc_context.key` in the data directory, 32 random bytes, created on first use.
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

use cdc_core::redact::TokenKey;

use crate::gucs;

/// The current settings: (path, version). Compare to know when to load again.
pub fn settings() -> (String, u32) {
    (gucs::string(&gucs::TOKENIZATION_KEY_FILE), gucs::TOKENIZATION_KEY_VERSION.get().max(1) as u32)
}

/// Loads the key the settings name: `Ok(None)` when no file is set. Errors name the file and
/// the problem, never its contents.
pub fn load((path, version): &(String, u32)) -> Result<Option<TokenKey>, String> {
    if path.is_empty() {
        return Ok(None);
    }
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the tokenization key file \"{path}\": {e}"))?;
    if !meta.is_file() {
        return Err(format!("the tokenization key file \"{path}\" is not a regular file"));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "the tokenization key file \"{path}\" can be read by group or others; it must be mode 0600 or 0400 (chmod 600)"
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read the tokenization key file \"{path}\": {e}"))?;
    TokenKey::parse(&bytes, *version).map(Some).map_err(|e| format!("tokenization key file \"{path}\": {}", e.message))
}

/// The context key file, relative to the data directory (every backend's working directory).
const CONTEXT_KEY_FILE: &str = "pg_cdc_context.key";

/// The context key, created on first use. Two backends may race to create it: each writes its
/// own temporary file and links it into place, so exactly one wins and both read the winner.
pub fn context_key() -> Result<Vec<u8>, String> {
    match std::fs::read(CONTEXT_KEY_FILE) {
        Ok(k) if k.len() == 32 => return Ok(k),
        Ok(_) => return Err(format!("the context key file \"{CONTEXT_KEY_FILE}\" in the data directory is damaged")),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot read the context key file \"{CONTEXT_KEY_FILE}\": {e}"))
        }
        Err(_) => {}
    }
    let mut key = [0u8; 32];
    // SAFETY: pg_strong_random writes exactly `len` bytes into the buffer it is given.
    if !unsafe { pgrx::pg_sys::pg_strong_random(key.as_mut_ptr().cast(), key.len()) } {
        return Err("cannot make the context key: no strong random source".into());
    }
    let tmp = format!("{CONTEXT_KEY_FILE}.{}", std::process::id());
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&key).and_then(|_| f.sync_all()));
    let linked = made.and_then(|_| std::fs::hard_link(&tmp, CONTEXT_KEY_FILE));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key.to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::read(CONTEXT_KEY_FILE).map_err(|e| format!("cannot read the context key file: {e}"))
        }
        Err(e) => Err(format!("cannot create the context key file \"{CONTEXT_KEY_FILE}\": {e}")),
    }
}
