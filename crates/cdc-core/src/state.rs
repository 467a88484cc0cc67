//! The lifecycle of a sink: one enum, whose labels are the only strings ever stored in
//! `_cdc_sinks.state` (a CHECK constraint in `sql/bootstrap.sql` and in each upgrade script lists
//! the same labels; a unit test keeps the three in step).
//!
//! ```text
//!  cdc_add_sink ─▶ starting ──(first delivery)──▶ running ◀──(delivered again)──┐
//!       │              │                            ▲                             │
//!       │              └──(snapshot to deliver)─▶ snapshotting (done) ─┘          │
//!       │              ▲                              │                           │
//!       │ (slot made   │ (worker made the slot)       ├─ broker away, timeout ─▶ retrying
//!       ▼  after COMMIT)                              └─ needs an operator ────▶ error
//!  creating_slot ──────┘
//! ```
//! `retrying` and `error` both keep the slot and try again with a backoff; `error` says that
//! retrying alone will not fix it (a dropped slot, an invalid config, a missing key).
use std::fmt;

/// Where a sink is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkState {
    /// Added inside a transaction that had already written: the worker creates its slot after
    /// the commit.
    CreatingSlot,
    /// The slot exists; nothing delivered since the worker (re)started the sink.
    Starting,
    /// Delivering its snapshot (the rows its tables held when it was added, as READ events),
    /// and the changes since.
    Snapshotting,
    /// Delivering.
    Running,
    /// A transient failure (broker unreachable, timeout): backing off, then trying again.
    Retrying,
    /// A failure an operator must look at (`last_error` says what); still tried again slowly.
    Error,
    /// A `snapshot_mode` `initial_only` sink that delivered its snapshot (and the changes committed
    /// while it ran): its slot is dropped, so it holds no WAL, and it reads nothing more.
    Finished,
}

impl SinkState {
    /// Every state, in lifecycle order.
    pub const ALL: [SinkState; 7] = [
        SinkState::CreatingSlot,
        SinkState::Starting,
        SinkState::Snapshotting,
        SinkState::Running,
        SinkState::Retrying,
        SinkState::Error,
        SinkState::Finished,
    ];

    /// The label stored in `_cdc_sinks.state` and shown by every monitoring function.
    pub fn label(self) -> &'static str {
        match self {
            SinkState::CreatingSlot => "creating_slot",
            SinkState::Starting => "starting",
            SinkState::Snapshotting => "snapshotting",
            SinkState::Running => "running",
            SinkState::Retrying => "retrying",
            SinkState::Error => "error",
            SinkState::Finished => "finished",
        }
    }

    /// The state a stored label names.
    pub fn parse(label: &str) -> Option<SinkState> {
        SinkState::ALL.into_iter().find(|s| s.label() == label)
    }
}

impl fmt::Display for SinkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for s in SinkState::ALL {
            assert_eq!(SinkState::parse(s.label()), Some(s));
        }
        assert_eq!(SinkState::parse("paused"), None);
    }

    /// The labels a CHECK constraint `CHECK (state IN ('a', 'b', ...))` named `name` allows in `sql`.
    fn check_labels(sql: &str, name: &str) -> Vec<String> {
        let at = sql.find(name).unwrap_or_else(|| panic!("no constraint {name}"));
        let rest = &sql[at..];
        let open = rest.find("IN (").expect("IN (") + 4;
        let close = rest[open..].find(')').expect(")") + open;
        rest[open..close].split(',').map(|s| s.trim().trim_matches('\'').to_string()).collect()
    }

    #[test]
    fn the_catalog_allows_exactly_these_labels() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sql");
        let labels: Vec<String> = SinkState::ALL.iter().map(|s| s.label().to_string()).collect();
        // The fresh install and the newest upgrade script that (re)defines the constraint (older
        // scripts define what their release allowed).
        let mut upgrades: Vec<(String, String)> = Vec::new();
        for entry in std::fs::read_dir(&root).expect("sql/") {
            let path = entry.expect("entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if !path.is_file() {
                continue; // sql/history: install scripts of earlier releases
            }
            let sql = std::fs::read_to_string(&path).expect("read");
            if name == "bootstrap.sql" {
                assert_eq!(check_labels(&sql, "_cdc_sinks_state_check"), labels, "{name}");
            } else if sql.contains("_cdc_sinks_state_check") {
                upgrades.push((name, sql));
            }
        }
        // pg_cdc--<from>--<to>.sql: the newest by its target version.
        let version = |n: &str| -> Vec<u32> {
            n.trim_end_matches(".sql")
                .rsplit("--")
                .next()
                .unwrap_or("")
                .split('.')
                .filter_map(|p| p.parse().ok())
                .collect()
        };
        let (name, sql) = upgrades.iter().max_by_key(|(n, _)| version(n)).expect("an upgrade script defines it");
        assert_eq!(check_labels(sql, "_cdc_sinks_state_check"), labels, "{name}");
    }
}
