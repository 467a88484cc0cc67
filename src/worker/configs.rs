//! What a worker keeps parsed from the catalog and the server settings between passes: the
//! capture configs of the tables (parsed once per change), the ones that cannot be read, and the
//! keys events are tokenized and user contexts sealed with.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use cdc_core::config::{parse_stored_capture_config, CaptureConfig};
use cdc_core::pipeline::SinkTables;
use cdc_core::redact::TokenKey;

use super::source::{self, Catalog, SinkRow};
use crate::keys;

/// The captured tables' configs.
#[derive(Default)]
pub struct Configs {
    /// Parsed capture configs by OID, with the text they were parsed from (config, key columns,
    /// schema history, routing position), so a config is parsed once.
    parsed: HashMap<u32, (String, Arc<CaptureConfig>)>,
    /// Captured tables whose stored config cannot be read (changed by hand, or by a version that
    /// no longer accepts it), with the reason: the sinks that carry them stop instead of dropping
    /// their changes.
    unreadable: HashMap<u32, String>,
}

impl Configs {
    /// Parses what changed in the catalog's tables since the last pass.
    pub fn refresh(&mut self, cat: &Catalog) {
        let mut next = HashMap::new();
        let mut unreadable = HashMap::new();
        for t in &cat.tables {
            let history = t.history.as_ref().map(ToString::to_string).unwrap_or_default();
            let text = t.config.to_string()
                + &t.key_columns.join("\u{1}")
                + "\u{2}"
                + &history
                + "\u{2}"
                + t.routing_lsn.as_deref().unwrap_or_default();
            let parsed = match self.parsed.remove(&t.oid) {
                Some((old_text, cfg)) if old_text == text => cfg,
                _ => match parse_stored_capture_config(&t.config, t.key_columns.clone()) {
                    Ok(mut cfg) => {
                        cfg.history = t.history.as_ref().map(|h| Arc::new(source::history(h)));
                        cfg.routing_lsn = t.routing_lsn.as_deref().and_then(|l| l.parse().ok());
                        Arc::new(cfg)
                    }
                    Err(e) => {
                        unreadable.insert(t.oid, e.to_string());
                        continue;
                    }
                },
            };
            next.insert(t.oid, (text, parsed));
        }
        self.parsed = next;
        self.unreadable = unreadable;
    }

    /// The configs of the tables a sink carries.
    pub fn tables_for(&self, row: &SinkRow) -> SinkTables {
        self.parsed.iter().filter(|(oid, _)| row.carries(**oid)).map(|(oid, (_, cfg))| (*oid, cfg.clone())).collect()
    }

    /// A table the sink carries whose stored config cannot be read, and why.
    pub fn unreadable_for(&self, row: &SinkRow) -> Option<(u32, &str)> {
        self.unreadable.iter().find(|(oid, _)| row.carries(**oid)).map(|(oid, why)| (*oid, why.as_str()))
    }
}

/// The tokenization key and the key user contexts are sealed with.
#[derive(Default)]
pub struct Keys {
    /// The tokenization key source last loaded (setting, file and its stamp).
    token_settings: Option<keys::KeySource>,
    /// The tokenization key it gave.
    pub token_key: Option<TokenKey>,
    /// The key user context messages are sealed with (made on first use).
    pub context_key: Option<Vec<u8>>,
    /// When loading it last failed (tried again a minute later, not every pass).
    context_key_failed: Option<Instant>,
}

impl Keys {
    /// Loads the context key when it has none (at most once a minute), and the tokenization key
    /// again when its settings changed (after a SIGHUP). Returns whether either changed.
    pub fn refresh(&mut self) -> bool {
        let mut changed = false;
        if self.context_key.is_none() && self.context_key_failed.is_none_or(|t| t.elapsed().as_secs() >= 60) {
            match keys::context_key() {
                Ok(k) => {
                    self.context_key = Some(k);
                    changed = true;
                }
                Err(e) => {
                    self.context_key_failed = Some(Instant::now());
                    pgrx::warning!("pg_cdc worker: {e}; user context is left out of events (trying again in a minute)")
                }
            }
        }
        let settings = keys::settings();
        if self.token_settings.as_ref() != Some(&settings) {
            self.token_key = keys::load(&settings).unwrap_or_else(|e| {
                pgrx::warning!("pg_cdc worker: {e}; tables that tokenize columns stop their sinks until it is fixed");
                None
            });
            self.token_settings = Some(settings);
            changed = true;
        }
        changed
    }
}
