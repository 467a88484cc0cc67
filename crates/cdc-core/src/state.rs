//! The lifecycle of a sink ([`SinkState`]) and of one table's snapshot for a sink
//! ([`SnapshotState`]). A sink's: one enum, whose labels are the only strings ever stored in
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
//!  creating_slot ──────┘        (starting fails as running does: retrying or error)
//!
//!  any state but creating_slot and finished ──cdc_pause_sink──▶ paused ──cdc_resume_sink──▶ starting
//!                                       (or by itself, past cdc.paused_max_wal_size) ──┘
//! ```
//! `retrying` and `error` both keep the slot and try again with a backoff; `error` says that
//! retrying alone will not fix it (a dropped slot, an invalid config, a missing key). `paused` is
//! the only state a person sets: the worker exits, the slot keeps its position (and the WAL after
//! it), and the worker never writes over it.
use std::fmt;

/// Where a sink is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkState {
    /// Added inside a transaction that had already written: the worker creates its slot after
    /// the commit (and, when it cannot yet, stays here with the reason and tries again).
    CreatingSlot,
    /// The slot exists (made by `cdc_add_sink`, or by the worker after the adding transaction
    /// committed), or the sink was resumed: nothing delivered yet since. A worker that restarts
    /// does not write it: the state stays what it was until the next change.
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
    /// Paused by `cdc_pause_sink`: no worker, its slot kept at its position (holding the WAL
    /// after it), outside any shared decoding; `cdc_resume_sink` starts it again from there.
    Paused,
}

impl SinkState {
    /// Every state, in lifecycle order.
    pub const ALL: [SinkState; 8] = [
        SinkState::CreatingSlot,
        SinkState::Starting,
        SinkState::Snapshotting,
        SinkState::Running,
        SinkState::Retrying,
        SinkState::Error,
        SinkState::Finished,
        SinkState::Paused,
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
            SinkState::Paused => "paused",
        }
    }

    /// The state a stored label names.
    pub fn parse(label: &str) -> Option<SinkState> {
        SinkState::ALL.into_iter().find(|s| s.label() == label)
    }

    /// Whether a worker delivers the sink in this state (every state but `finished` and `paused`).
    pub fn has_worker(self) -> bool {
        !matches!(self, SinkState::Finished | SinkState::Paused)
    }
}

impl fmt::Display for SinkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Where one table's snapshot for one sink is (`_cdc_snapshots.state`; a CHECK constraint in
/// `sql/bootstrap.sql` lists the same labels, and a unit test keeps the two in step).
///
/// ```text
///  requested ─▶ pending ──(first chunk read)──▶ running ──(last chunk delivered)──▶ done
///                  │                               │
///                  ├─ table no longer captured, or no key to chunk by ─▶ skipped
///                  └─ cdc_cancel_snapshot ─────────┴─────────────────────▶ cancelled
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotState {
    /// Requested; no chunk read yet.
    Pending,
    /// Chunks are being read and delivered.
    Running,
    /// Every row was delivered.
    Done,
    /// Not taken: the table is no longer captured, or has no key to read it by.
    Skipped,
    /// Cancelled by `cdc_cancel_snapshot`.
    Cancelled,
}

impl SnapshotState {
    /// Every state, in lifecycle order.
    pub const ALL: [SnapshotState; 5] = [
        SnapshotState::Pending,
        SnapshotState::Running,
        SnapshotState::Done,
        SnapshotState::Skipped,
        SnapshotState::Cancelled,
    ];

    /// The states of a snapshot with rows left to deliver.
    pub const OPEN: [SnapshotState; 2] = [SnapshotState::Pending, SnapshotState::Running];

    /// The label stored in `_cdc_snapshots.state` and shown by `cdc_snapshots`.
    pub fn label(self) -> &'static str {
        match self {
            SnapshotState::Pending => "pending",
            SnapshotState::Running => "running",
            SnapshotState::Done => "done",
            SnapshotState::Skipped => "skipped",
            SnapshotState::Cancelled => "cancelled",
        }
    }

    /// The state a stored label names.
    pub fn parse(label: &str) -> Option<SnapshotState> {
        SnapshotState::ALL.into_iter().find(|s| s.label() == label)
    }

    /// It has rows left to deliver.
    pub fn is_open(self) -> bool {
        SnapshotState::OPEN.contains(&self)
    }

    /// The label as an SQL literal: `'running'`.
    pub fn sql(self) -> String {
        format!("'{}'", self.label())
    }

    /// The open states as an SQL list: `('pending', 'running')`.
    pub fn open_sql() -> String {
        let labels: Vec<String> = SnapshotState::OPEN.iter().map(|s| s.sql()).collect();
        format!("({})", labels.join(", "))
    }
}

impl fmt::Display for SnapshotState {
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
        assert_eq!(SinkState::parse("stopped"), None);
        let idle: Vec<SinkState> = SinkState::ALL.into_iter().filter(|s| !s.has_worker()).collect();
        assert_eq!(idle, [SinkState::Finished, SinkState::Paused]);
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
        let root = crate::testutil::crate_dir(env!("CARGO_MANIFEST_DIR")).join("../../sql");
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

    #[test]
    fn snapshot_labels_round_trip_and_only_pending_and_running_are_open() {
        for s in SnapshotState::ALL {
            assert_eq!(SnapshotState::parse(s.label()), Some(s));
            assert_eq!(s.is_open(), matches!(s, SnapshotState::Pending | SnapshotState::Running), "{s}");
        }
        assert_eq!(SnapshotState::parse("paused"), None);
        assert_eq!(SnapshotState::open_sql(), "('pending', 'running')");
        assert_eq!(SnapshotState::Done.sql(), "'done'");
    }

    #[test]
    fn the_catalog_allows_exactly_these_snapshot_labels() {
        let root = crate::testutil::crate_dir(env!("CARGO_MANIFEST_DIR")).join("../../sql");
        let labels: Vec<String> = SnapshotState::ALL.iter().map(|s| s.label().to_string()).collect();
        // The fresh install, and the upgrade script that made the table.
        for name in ["bootstrap.sql", "pg_cdc--0.3.0--0.4.0.sql"] {
            let sql = std::fs::read_to_string(root.join(name)).expect("read");
            let table = &sql[sql.find("_cdc_snapshots (").expect("the table")..];
            let column = &table[table.find("\n    state ").expect("its state column")..];
            assert_eq!(check_labels(column, "state"), labels, "{name}");
        }
    }
}
