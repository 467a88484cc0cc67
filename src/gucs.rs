//! Every server setting of pg_cdc, under the `cdc.` prefix.
//!
//! | setting | context | default | meaning |
//! |---|---|---|---|
//! | `cdc.database` | postmaster | `postgres` | database the worker connects to (where `CREATE EXTENSION pg_cdc` ran) |
//! | `cdc.kafka_bootstrap_servers` | sighup | `127.0.0.1:9092` | Kafka servers for sinks whose config gives none |
//! | `cdc.aws_region` | sighup | (none) | AWS region for Kinesis sinks whose config gives none (else the AWS default chain: `AWS_REGION`, the profile's region) |
//! | `cdc.kinesis_endpoint` | sighup | (none) | Kinesis endpoint URL for sinks whose config gives none (else `AWS_ENDPOINT_URL_KINESIS`, `AWS_ENDPOINT_URL`, or the region's endpoint) |
//! | `cdc.pubsub_endpoint` | sighup | (none) | Pub/Sub endpoint URL for sinks whose config gives none (else `https://pubsub.googleapis.com`); an `http://` URL is an emulator, reached without credentials |
//! | `cdc.schema_registry` | sighup | (none) | schema registry URL of Avro sinks when neither the sink's `schema_registry` nor the table's `schema_evolution.schema_registry` names one |
//! | `cdc.naptime_ms` | sighup | 200 | longest worker sleep when no sink had work (while changes keep coming it wakes within 5 ms of new WAL; each empty pass doubles that, up to this) |
//! | `cdc.batch_changes` | sighup | 100000 | messages one read takes from the decoding session, one Kafka transaction (whole transactions are never split); at most min(this, 10000) frames are held in memory |
//! | `cdc.heartbeat_interval_ms` | sighup | 10000 | how often an idle sink moves its slot forward over WAL it does not capture |
//! | `cdc.max_retry_backoff_ms` | sighup | 30000 | cap of the exponential backoff after a sink error |
//! | `cdc.tokenization_key_file` | sighup, superuser | (none) | file holding the secret key of `tokenize` (mode 0600 or 0400) |
//! | `cdc.tokenization_key_version` | sighup, superuser | 1 | version of that key, reported in events; change it with the key |
//! | `cdc.admin_file_dir` | sighup, superuser | (none) | the directory whose files a role that is not a superuser may name in a sink config (none: no file) |
use std::ffi::CString;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `cdc.database`.
pub static DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"postgres"));
/// `cdc.kafka_bootstrap_servers`.
pub static KAFKA_BOOTSTRAP_SERVERS: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"127.0.0.1:9092"));
/// `cdc.aws_region`.
pub static AWS_REGION: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `cdc.kinesis_endpoint`.
pub static KINESIS_ENDPOINT: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `cdc.pubsub_endpoint`.
pub static PUBSUB_ENDPOINT: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `cdc.schema_registry`.
pub static SCHEMA_REGISTRY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `cdc.naptime_ms`.
pub static NAPTIME_MS: GucSetting<i32> = GucSetting::<i32>::new(200);
/// `cdc.batch_changes`.
pub static BATCH_CHANGES: GucSetting<i32> = GucSetting::<i32>::new(100_000);
/// `cdc.max_concurrent_reads`.
pub static MAX_CONCURRENT_READS: GucSetting<i32> = GucSetting::<i32>::new(1);
/// `cdc.wal_warning_bytes` (0: off).
pub static WAL_WARNING_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024);
/// `cdc.paused_max_wal_size`: WAL (MB) a paused sink's slot may hold before the sink resumes by itself (-1: no bound).
pub static PAUSED_MAX_WAL_SIZE: GucSetting<i32> = GucSetting::<i32>::new(-1);
/// `cdc.ready_max_lag`: how far (MB) behind the WAL a sink may be for `cdc_ready()`.
pub static READY_MAX_LAG: GucSetting<i32> = GucSetting::<i32>::new(16);
/// `cdc.enrich_cache_rows`.
pub static ENRICH_CACHE_ROWS: GucSetting<i32> = GucSetting::<i32>::new(100_000);
/// `cdc.heartbeat_interval_ms`.
pub static HEARTBEAT_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
/// `cdc.max_retry_backoff_ms`.
pub static MAX_RETRY_BACKOFF_MS: GucSetting<i32> = GucSetting::<i32>::new(30_000);
/// `cdc.shared_decoding`: whether the sinks share one decoding of the WAL.
#[derive(pgrx::PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum SharedDecoding {
    /// Every sink decodes its own slot.
    #[name = c"off"]
    Off,
    /// Shared whenever a sink exists.
    #[name = c"on"]
    On,
    /// Shared once the database has [`SHARED_DECODING_AUTO_SINKS`] sinks or more (the default).
    #[name = c"auto"]
    Auto,
    /// Spellings PostgreSQL accepts for a boolean.
    #[name = c"true"]
    #[hidden = true]
    True,
    #[name = c"false"]
    #[hidden = true]
    False,
    #[name = c"yes"]
    #[hidden = true]
    Yes,
    #[name = c"no"]
    #[hidden = true]
    No,
    #[name = c"1"]
    #[hidden = true]
    One,
    #[name = c"0"]
    #[hidden = true]
    Zero,
}

/// `cdc.shared_decoding = auto` shares the decoding from this many sinks on (see
/// ARCHITECTURE.md, "Many sinks, one decoding", for the measurements behind it).
pub const SHARED_DECODING_AUTO_SINKS: usize = 10;

/// `cdc.shared_decoding`.
pub static SHARED_DECODING: GucSetting<SharedDecoding> = GucSetting::<SharedDecoding>::new(SharedDecoding::Auto);

impl SharedDecoding {
    /// `off`, `on` or `auto`: a boolean spelling read as `on` or `off`.
    fn mode(self) -> SharedDecoding {
        match self {
            SharedDecoding::True | SharedDecoding::Yes | SharedDecoding::One => SharedDecoding::On,
            SharedDecoding::False | SharedDecoding::No | SharedDecoding::Zero => SharedDecoding::Off,
            mode => mode,
        }
    }
}

/// Whether the setting lets the decoding be shared at all (`on` or `auto`).
pub fn shared_decoding_allowed() -> bool {
    SHARED_DECODING.get().mode() != SharedDecoding::Off
}

/// Whether the sinks share one decoding with `sinks` sinks (workers) in the database.
pub fn shared_decoding_wanted(sinks: usize) -> bool {
    match SHARED_DECODING.get().mode() {
        SharedDecoding::Auto => sinks >= SHARED_DECODING_AUTO_SINKS,
        SharedDecoding::On => sinks > 0,
        _ => false,
    }
}
/// `cdc.shared_decoding_max_lag` (MB).
pub static SHARED_DECODING_MAX_LAG: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// `cdc.tokenization_key_file`: the path, never the key (settings are logged when they change).
pub static TOKENIZATION_KEY_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `cdc.admin_file_dir`: see [`crate::api::access`].
pub static ADMIN_FILE_DIR: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `cdc.tokenization_key_version`.
pub static TOKENIZATION_KEY_VERSION: GucSetting<i32> = GucSetting::<i32>::new(1);

/// `cdc.test_failpoint`: test-only; `after_sink_commit` makes the worker exit right after a Kafka
/// commit and before it confirms the slot (the crash window exactly-once must survive);
/// `cleanup_unreachable` makes the launcher's deletion of a dropped sink's progress topic fail.
pub static TEST_FAILPOINT: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `cdc.test_skip_dedup`: test-only; turns off skipping of already-committed transactions, so the
/// fault-injection suite can prove its oracle detects duplicates.
pub static TEST_SKIP_DEDUP: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `cdc.test_skip_snapshot_window`: test-only; delivers every row of a snapshot chunk, also those
/// changed while it was in flight, and every change of a keyless table, also those its rows'
/// snapshot holds, so the snapshot tests can prove their oracle sees stale and doubled rows.
pub static TEST_SKIP_SNAPSHOT_WINDOW: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `cdc.test_ignore_standby_slots`: test only; reads go to the flushed WAL whatever the standbys of
/// `synchronized_standby_slots` confirmed, as decoding in the worker's own process did before, so
/// the failover tests can prove their oracle sees rows delivered ahead of a standby.
pub static TEST_IGNORE_STANDBY_SLOTS: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `cdc.test_reset_caches_each_read`: test only; a read drops the backend's catalog caches after
/// decoding as well, as every read did before `catalog::present_catalog` (the benchmark's
/// side-by-side figure of what keeping them saves).
pub static TEST_RESET_CACHES_EACH_READ: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `cdc.test_members_poll_publishes`: test-only; sinks reading the shared decoding's log look for
/// new publishes as they did before the decoder woke them: every 5 ms after a pass that read,
/// doubling up to `cdc.naptime_ms` after passes that did not, whatever tables a publish changed
/// (the benchmark's and the tests' side-by-side comparison).
pub static TEST_MEMBERS_POLL_PUBLISHES: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `cdc.test_snapshot_ignore_checkpoint`: test-only; a restarted sink settles the snapshot chunk it
/// had in flight by the slot's confirmed position alone, not its destination's checkpoint, so the
/// snapshot tests can prove their oracle sees the duplicates that would cause.
pub static TEST_SNAPSHOT_IGNORE_CHECKPOINT: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `cdc.test_apply_shuffle`: test-only; a seed (0: off) with which postgres sinks reorder and
/// repeat what they are sent, holding some back for later units, so the apply tests can prove the
/// row versions make late and repeated changes harmless; a negative seed also ignores the versions
/// (the negative control). What is held back is lost on a restart.
pub static TEST_APPLY_SHUFFLE: GucSetting<i32> = GucSetting::<i32>::new(0);

/// `cdc.test_pulsar_reuse_producer_name`: test-only; pulsar sinks name every producer
/// `<producer_name>` alone, as a client that reuses a name would (the negative control of the
/// naming that keeps broker-side deduplication from dropping a new producer's first messages).
pub static TEST_PULSAR_REUSE_PRODUCER_NAME: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Registers the settings (from `_PG_init`; `preloading`: loaded by shared_preload_libraries, the
/// only time a setting read at server start may be defined).
pub fn init(preloading: bool) {
    GucRegistry::define_string_guc(
        c"cdc.tokenization_key_file",
        c"File holding the secret key of the tokenize redaction method.",
        c"Readable by the server's OS user only (mode 0600 or 0400). The key itself is never a setting, \
          because PostgreSQL logs settings when they change.",
        &TOKENIZATION_KEY_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"cdc.admin_file_dir",
        c"Directory whose files roles that are not superusers may name in sink configs.",
        c"Secret files, key files, ssl.*.location and password files of a sink added by a role that is not a \
          superuser must be inside it (symbolic links followed); when not set, such a role names no file.",
        &ADMIN_FILE_DIR,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_int_guc(
        c"cdc.tokenization_key_version",
        c"Version of the tokenization key, reported in events next to the tokens.",
        c"Change it whenever the key changes: tokens of different versions differ.",
        &TOKENIZATION_KEY_VERSION,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"cdc.test_failpoint",
        c"Test only: a point where the worker exits (or fails) on purpose, as <failpoint>:<sink name>.",
        c"after_sink_commit: exit after a Kafka commit, before the slot is confirmed; cleanup_unreachable: the deletion of a dropped sink's progress topic fails.",
        &TEST_FAILPOINT,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_int_guc(
        c"cdc.test_apply_shuffle",
        c"Test only: postgres sinks reorder and repeat what they are sent, with this seed (0: off).",
        c"A negative seed also ignores the row versions (the negative control).",
        &TEST_APPLY_SHUFFLE,
        -i32::MAX,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"cdc.test_pulsar_reuse_producer_name",
        c"Test only: pulsar sinks reuse their producer name across producers.",
        c"The negative control of the producer naming (broker-side deduplication drops the new producer's messages).",
        &TEST_PULSAR_REUSE_PRODUCER_NAME,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"cdc.test_skip_dedup",
        c"Test only: do not skip transactions already committed to Kafka.",
        c"",
        &TEST_SKIP_DEDUP,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"cdc.test_ignore_standby_slots",
        c"Test only: decode up to the flushed WAL whatever the standbys of synchronized_standby_slots confirmed.",
        c"",
        &TEST_IGNORE_STANDBY_SLOTS,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"cdc.test_reset_caches_each_read",
        c"Test only: drop the worker's catalog caches after every read, as every read did before they were kept.",
        c"",
        &TEST_RESET_CACHES_EACH_READ,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"cdc.test_members_poll_publishes",
        c"Test only: sinks reading the shared decoding's log look for new publishes as before the decoder woke them.",
        c"",
        &TEST_MEMBERS_POLL_PUBLISHES,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"cdc.test_skip_snapshot_window",
        c"Test only: deliver every row of a snapshot chunk, also rows changed while it was in flight, and every change of a keyless table, also those its rows' snapshot holds.",
        c"",
        &TEST_SKIP_SNAPSHOT_WINDOW,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"cdc.test_snapshot_ignore_checkpoint",
        c"Test only: settle a snapshot chunk in flight at a restart by the slot alone, not the checkpoint.",
        c"",
        &TEST_SNAPSHOT_IGNORE_CHECKPOINT,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    // A setting read at server start can only be defined then: a backend that loads pg_cdc
    // without shared_preload_libraries (LOAD, CREATE EXTENSION, pg_upgrade's check that libraries
    // load) leaves it out instead of failing; its SQL functions refuse to run there anyway.
    if preloading {
        GucRegistry::define_string_guc(
            c"cdc.database",
            c"Database the pg_cdc worker connects to.",
            c"Create the pg_cdc extension in this database. Changing it requires a restart.",
            &DATABASE,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
    GucRegistry::define_string_guc(
        c"cdc.kafka_bootstrap_servers",
        c"Kafka bootstrap servers for sinks whose config names none.",
        c"",
        &KAFKA_BOOTSTRAP_SERVERS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"cdc.schema_registry",
        c"Schema registry URL of Avro sinks whose config and tables name none.",
        c"http://host:port or https://host:port; credentials may be given as https://user:secret@host.",
        &SCHEMA_REGISTRY,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"cdc.aws_region",
        c"AWS region for Kinesis sinks whose config names none.",
        c"Unset: the AWS default chain (AWS_REGION, the profile's region).",
        &AWS_REGION,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"cdc.kinesis_endpoint",
        c"Kinesis endpoint URL for sinks whose config names none.",
        c"Unset: AWS_ENDPOINT_URL_KINESIS, AWS_ENDPOINT_URL, or the region's endpoint.",
        &KINESIS_ENDPOINT,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"cdc.pubsub_endpoint",
        c"Pub/Sub endpoint URL for sinks whose config names none.",
        c"Unset: https://pubsub.googleapis.com. An http:// URL is an emulator, reached without credentials.",
        &PUBSUB_ENDPOINT,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"cdc.naptime_ms",
        c"How long the pg_cdc worker sleeps when no sink had work.",
        c"",
        &NAPTIME_MS,
        10,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"cdc.batch_changes",
        c"Changes read from a slot per batch, one Kafka transaction (whole transactions are never split).",
        c"",
        &BATCH_CHANGES,
        1,
        10_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"cdc.max_concurrent_reads",
        c"Sink workers that read (decode) their slots at the same time, in each of two pools; the others wait their turn.",
        c"Sinks that sent something in the last second take turns apart from idle ones. Each slot decodes all of the database's WAL; on a primary with few cores, parallel reads by many sinks take CPU from the application. Waiting for a destination (a Kafka commit) holds no turn.",
        &MAX_CONCURRENT_READS,
        1,
        1024,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"cdc.wal_warning_bytes",
        c"Retained WAL (MB) past which the worker logs a WARNING for a sink's slot; 0 turns it off.",
        c"Repeated every 5 minutes while the slot stays above it. cdc_status() shows retained_wal_bytes and safe_wal_size.",
        &WAL_WARNING_BYTES,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"cdc.paused_max_wal_size",
        c"WAL (MB) a paused sink's slot may hold; past it the sink resumes by itself. -1: no bound of pg_cdc's own.",
        c"A paused sink's slot keeps the WAL written while it is paused. Past this bound the launcher resumes the sink (a WARNING, and last_error says why): it delivers and its slot moves on once its destination takes events. PostgreSQL's max_slot_wal_keep_size is the hard bound: past it PostgreSQL invalidates the slot and the sink stops in error.",
        &PAUSED_MAX_WAL_SIZE,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"cdc.ready_max_lag",
        c"How far (MB) behind the WAL a running sink may be for cdc_ready() to call it ready.",
        c"cdc_ready(max_lag_bytes) overrides it for one call; cdc_prometheus_metrics() reports pg_cdc_ready with it.",
        &READY_MAX_LAG,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"cdc.enrich_cache_rows",
        c"Rows of each lookup table a sink keeps in the worker's memory for enrich transformations.",
        c"Lookups of other rows read the sink's copy in _cdc_lookup_rows (cdc_filter_metrics reports the hit rate). \
          Rows changed since the last confirmed batch are kept beyond this.",
        &ENRICH_CACHE_ROWS,
        1,
        100_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"cdc.heartbeat_interval_ms",
        c"How often an idle sink moves its slot past WAL it does not capture.",
        c"Keeps retained WAL bounded when captured tables are quiet.",
        &HEARTBEAT_INTERVAL_MS,
        100,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"cdc.max_retry_backoff_ms",
        c"Cap of the exponential backoff after a sink error.",
        c"",
        &MAX_RETRY_BACKOFF_MS,
        100,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_enum_guc(
        c"cdc.shared_decoding",
        c"Sinks read one shared decoding of the WAL (the group's decoder) instead of decoding it each: off, on, or auto (from 10 sinks on).",
        c"Each sink keeps its slot, moved without decoding; a sink the group's log cannot serve reads its own slot.",
        &SHARED_DECODING,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"cdc.shared_decoding_max_lag",
        c"WAL (MB) a sink may be behind before the shared decoding stops waiting for it.",
        c"A sink further behind no longer holds the group's slot and log; it goes on from its own slot.",
        &SHARED_DECODING_MAX_LAG,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    // Reserve the prefix so a typo such as cdc.databse is reported instead of ignored.
    // SAFETY: called from _PG_init with a static NUL-terminated string.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"cdc".as_ptr()) };
}

/// Reads a string setting.
pub fn string(setting: &GucSetting<Option<CString>>) -> String {
    setting.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}
