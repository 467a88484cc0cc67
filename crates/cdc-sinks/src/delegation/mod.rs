//! What a sink config may hold when the role adding it is not a superuser (a member of
//! `pg_cdc_admin`): the sink's worker runs as a superuser, so a config must not let its author
//! read files, run commands or borrow credentials that are the server's rather than theirs.
//!
//! - Every file a config names (secret files, key files, `ssl.*.location`, a password file) must
//!   be inside the directory a superuser sets in `cdc.admin_file_dir` ([`confine`]).
//! - librdkafka properties that run a command or load code are refused ([`REFUSED_PROPERTIES`]).
//! - A PostgreSQL sink's connection names its password file (`passfile`), and takes no `service`:
//!   the server's own `~/.pgpass` and service files are the superuser's credentials. Where it may
//!   connect is checked when its worker connects (see `postgres::libpq::Libpq::check_delegated`).
//!
//! Superusers keep every form. The rules are checked when the sink is added; the connection rules
//! each time its worker connects.
use std::path::{Path, PathBuf};

use cdc_core::{CdcError, CdcResult, ErrorKind};

use crate::postgres::libpq::conninfo_options;
use crate::registry::SinkConfig;

/// librdkafka properties that run a command or load code into the server: refused for a role that
/// is not a superuser.
pub const REFUSED_PROPERTIES: &[(&str, &str)] = &[
    ("sasl.kerberos.kinit.cmd", "runs a shell command"),
    ("plugin.library.paths", "loads a shared library"),
    ("ssl.engine.location", "loads an OpenSSL engine"),
    ("ssl.engine.id", "loads an OpenSSL engine"),
    ("ssl.providers", "loads OpenSSL providers"),
];

/// Values of a file property that name no file (`ssl.ca.location=probe` searches the system's
/// usual places).
const NOT_A_FILE: &[&str] = &["probe"];

/// Whether a librdkafka property names a file or directory (`ssl.ca.location`, `ssl.key.location`,
/// `sasl.kerberos.keytab`, `sasl.oauthbearer.assertion.private.key.file`, ...).
pub fn is_file_property(key: &str) -> bool {
    key.ends_with(".location") || key.ends_with(".keytab") || key.ends_with(".file")
}

/// libpq connection options that name a file (`sslrootcert=system` names none).
const CONNINFO_FILES: &[&str] = &["passfile", "sslcert", "sslkey", "sslrootcert", "sslcrl", "sslcrldir"];

fn refused(message: impl Into<String>) -> CdcError {
    CdcError::new(ErrorKind::InsufficientPrivilege, message)
}

/// The files a sink config names, each with its JSON path, in config order.
pub fn file_paths(cfg: &SinkConfig) -> CdcResult<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut properties = |props: &std::collections::BTreeMap<String, String>| {
        for (k, v) in props {
            if is_file_property(k) && !NOT_A_FILE.contains(&v.as_str()) {
                out.push((format!("config.properties.\"{k}\""), v.clone()));
            }
        }
    };
    match cfg {
        SinkConfig::Kafka(c) => properties(&c.properties),
        SinkConfig::EventHub(c) => {
            properties(&c.properties);
            if let crate::eventhub::config::Connection::File(path) = &c.connection {
                out.push(("config.connection_string_file".into(), path.clone()));
            }
        }
        SinkConfig::Webhook(c) => {
            if let Some(p) = &c.secret_file {
                out.push(("config.secret_file".into(), p.clone()));
            }
        }
        SinkConfig::PubSub(c) => {
            if let Some(p) = &c.credentials_file {
                out.push(("config.credentials_file".into(), p.clone()));
            }
        }
        SinkConfig::Pulsar(c) => {
            if let Some(p) = &c.auth_token_file {
                out.push(("config.auth_token_file".into(), p.clone()));
            }
        }
        SinkConfig::Postgres(c) => {
            let options = conninfo_options(&c.connection, CONNINFO_FILES)
                .map_err(|e| CdcError::new(ErrorKind::InvalidParameter, e))?;
            for (k, v) in options {
                let names_none = v.is_empty() || (k == "sslrootcert" && v == "system");
                if !names_none {
                    out.push((format!("config.connection ({k})"), v));
                }
            }
        }
        SinkConfig::Table(_) | SinkConfig::Kinesis(_) => {}
    }
    Ok(out)
}

/// Refuses what a role that is not a superuser may not put in a sink config, besides where its
/// files are ([`confine`] checks that): code-running librdkafka properties, and a PostgreSQL
/// connection without its own password file or through a service file.
pub fn check_config(cfg: &SinkConfig) -> CdcResult<()> {
    let properties = match cfg {
        SinkConfig::Kafka(c) => Some(&c.properties),
        SinkConfig::EventHub(c) => Some(&c.properties),
        _ => None,
    };
    for key in properties.into_iter().flat_map(|p| p.keys()) {
        if let Some((_, what)) = REFUSED_PROPERTIES.iter().find(|(k, _)| k == key) {
            return Err(refused(format!("config.properties.\"{key}\" {what}: only a superuser may set it"))
                .hint("Ask a superuser to add this sink, or leave the property out."));
        }
    }
    if let SinkConfig::Postgres(c) = cfg {
        let options = conninfo_options(&c.connection, &["passfile", "service"])
            .map_err(|e| CdcError::new(ErrorKind::InvalidParameter, e))?;
        let has = |key: &str| options.iter().any(|(k, v)| k == key && !v.is_empty());
        if has("service") {
            return Err(refused(
                "config.connection: only a superuser may use a service file (service=): its entries are the server's",
            )
            .hint("Write the host, port, dbname and user into the connection string, with passfile=."));
        }
        if !has("passfile") {
            return Err(refused(
                "config.connection must name its password file (passfile=) when the sink is not added by a superuser",
            )
            .hint("The server's own ~/.pgpass holds the server's passwords: put the sink's in a file in cdc.admin_file_dir."));
        }
    }
    Ok(())
}

/// Checks that `file` (as the server resolves it: relative paths from the data directory, its
/// working directory) is inside `dir`, symbolic links followed; `json_path` names it in the error.
/// `dir` is `cdc.admin_file_dir`; `None` when it is not set, so no file is allowed.
pub fn confine(dir: Option<&str>, json_path: &str, file: &str) -> CdcResult<()> {
    let Some(dir) = dir.filter(|d| !d.is_empty()) else {
        return Err(refused(format!(
            "{json_path} names a file, and cdc.admin_file_dir is not set: only a superuser may name files"
        ))
        .hint("A superuser sets cdc.admin_file_dir (ALTER SYSTEM, then SELECT pg_reload_conf()) to the directory whose files roles that are not superusers may name."));
    };
    let real_dir: PathBuf = std::fs::canonicalize(dir).map_err(|e| {
        refused(format!("{json_path}: cdc.admin_file_dir \"{dir}\" cannot be read: {e}"))
            .hint("A superuser creates it or sets cdc.admin_file_dir to a directory that exists.")
    })?;
    let real = std::fs::canonicalize(Path::new(file)).map_err(|e| {
        refused(format!("{json_path}: the file cannot be checked: {e}"))
            .hint(format!("Name a file that exists in cdc.admin_file_dir ({dir})."))
    })?;
    if real.starts_with(&real_dir) && real != real_dir {
        Ok(())
    } else {
        Err(refused(format!("{json_path} is outside cdc.admin_file_dir ({dir}); only a superuser may name it"))
            .hint(format!("Put the file in {dir} (symbolic links are followed, so one pointing out is refused too).")))
    }
}

#[cfg(test)]
mod tests;
