//! Probe: how long does one exactly-once Kafka transaction take, and where does the time go?
//!
//! Builds a transactional producer the way `KafkaSink::new` does (acks=all, idempotence,
//! queue.buffering.max.kbytes, message.timeout.ms, transactional.id), then runs N transactions
//! back to back: begin_transaction, K data records (~SIZE bytes) to a data topic, one checkpoint
//! record to partition 0 of a second (compacted) topic, commit_transaction. Prints p50/p99/max of
//! each phase.
//!
//!   CARGO_TARGET_DIR=/var/tmp/txnprobe-target cargo run --release -p cdc-sinks --example txn_probe -- \
//!       [--bootstrap HOST:PORT] [--txns N] [--k K] [--size BYTES] [--mode sink|preflush|raw]
//!       [--partitions P] [--key-spread] [--log] [--sleep-ms MS] [librdkafka.key=value ...]
//!
//! Modes (how the commit is driven):
//!   sink      `producer.commit_transaction(30 s)` alone, what KafkaSink::flush did before it drained first. rdkafka's
//!             BaseProducer::commit_transaction first runs its own flush(), which calls
//!             rd_kafka_flush(rk, 0) and, while anything is in flight, `poll(min(remaining, 100 ms))`
//!             -- and BaseProducer::poll only returns when its whole timeout has elapsed.
//!   preflush  first serve delivery reports with short polls until `in_flight_count() == 0`, then
//!             `producer.commit_transaction` (whose flush is then a no-op): what KafkaSink::flush does.
//!   raw       preflush, then `rd_kafka_commit_transaction` straight through the bindings.
//!
//! `--log` prints librdkafka's log lines (set e.g. `debug=eos,protocol,msg,broker`) and the probe's
//! phase marks on stderr, all stamped with milliseconds since the probe started.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

// Same values as crates/cdc-sinks/src/kafka/mod.rs.
const QUEUE_MAX_KBYTES: u32 = 65_536;
const MESSAGE_TIMEOUT_MS: u32 = 30_000;
const TIMEOUT: Duration = Duration::from_secs(30);

static T0: OnceLock<Instant> = OnceLock::new();
static LOG: OnceLock<bool> = OnceLock::new();

fn now_ms() -> f64 {
    T0.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

fn mark(what: std::fmt::Arguments<'_>) {
    if *LOG.get().unwrap_or(&false) {
        eprintln!("{:>10.3} PROBE {}", now_ms(), what);
    }
}

#[derive(Default)]
struct Ctx {
    delivered: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Ctx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if *LOG.get().unwrap_or(&false) {
            eprintln!("{:>10.3} {:?} {} {}", now_ms(), level, fac, log_message);
        }
    }
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => self.delivered.fetch_add(1, Ordering::Relaxed),
            Err((e, _)) => {
                eprintln!("delivery failed: {e}");
                self.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

struct Args {
    bootstrap: String,
    txns: usize,
    k: usize,
    size: usize,
    mode: String,
    partitions: i32,
    key_spread: bool,
    sleep_ms: u64,
    topic: String,
    progress: String,
    tid: String,
    extra: Vec<(String, String)>,
}

fn parse() -> Args {
    let mut a = Args {
        bootstrap: std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9292".into()),
        txns: 200,
        k: 1,
        size: 200,
        mode: "sink".into(),
        partitions: 3,
        key_spread: false,
        sleep_ms: 0,
        topic: "txnprobe.data".into(),
        progress: "txnprobe.progress".into(),
        tid: format!("txnprobe-{}", std::process::id()),
        extra: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        let mut val = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match s.as_str() {
            "--bootstrap" => a.bootstrap = val("--bootstrap"),
            "--txns" => a.txns = val("--txns").parse().unwrap(),
            "--k" => a.k = val("--k").parse().unwrap(),
            "--size" => a.size = val("--size").parse().unwrap(),
            "--mode" => a.mode = val("--mode"),
            "--partitions" => a.partitions = val("--partitions").parse().unwrap(),
            "--sleep-ms" => a.sleep_ms = val("--sleep-ms").parse().unwrap(),
            "--topic" => a.topic = val("--topic"),
            "--progress" => a.progress = val("--progress"),
            "--tid" => a.tid = val("--tid"),
            "--key-spread" => a.key_spread = true,
            "--log" => {
                LOG.set(true).ok();
            }
            kv if kv.contains('=') => {
                let (k, v) = kv.split_once('=').unwrap();
                a.extra.push((k.to_string(), v.to_string()));
            }
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(["sink", "preflush", "raw"].contains(&a.mode.as_str()), "bad --mode");
    a
}

fn ensure_topics(a: &Args) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &a.bootstrap).create().expect("admin client");
    let data = NewTopic::new(&a.topic, a.partitions, TopicReplication::Fixed(1));
    let prog = NewTopic::new(&a.progress, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    let res =
        futures_executor::block_on(admin.create_topics(&[data, prog], &AdminOptions::new())).expect("create_topics");
    for r in res {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => panic!("cannot create {t}: {e}"),
        }
    }
}

/// Serves delivery reports until nothing is in flight (what rd_kafka_flush waits for).
fn preflush(p: &BaseProducer<Ctx>) {
    let deadline = Instant::now() + TIMEOUT;
    while p.in_flight_count() > 0 {
        assert!(Instant::now() < deadline, "preflush timed out");
        p.poll(Duration::from_millis(1));
    }
}

fn raw_commit(p: &BaseProducer<Ctx>) -> Result<(), String> {
    unsafe {
        let e = rdkafka::bindings::rd_kafka_commit_transaction(p.client().native_ptr(), TIMEOUT.as_millis() as i32);
        if e.is_null() {
            return Ok(());
        }
        let msg = std::ffi::CStr::from_ptr(rdkafka::bindings::rd_kafka_error_string(e)).to_string_lossy().into_owned();
        rdkafka::bindings::rd_kafka_error_destroy(e);
        Err(msg)
    }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i]
}

fn main() {
    T0.get_or_init(Instant::now);
    let a = parse();
    ensure_topics(&a);

    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &a.bootstrap)
        .set("client.id", "txnprobe")
        .set("transactional.id", &a.tid)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("queue.buffering.max.kbytes", QUEUE_MAX_KBYTES.to_string())
        .set("message.timeout.ms", MESSAGE_TIMEOUT_MS.to_string());
    for (k, v) in &a.extra {
        cc.set(k, v);
    }
    if *LOG.get().unwrap_or(&false) {
        cc.set_log_level(RDKafkaLogLevel::Debug);
    }
    let p: BaseProducer<Ctx> = cc.create_with_context(Ctx::default()).expect("producer");
    p.init_transactions(TIMEOUT).expect("init_transactions");

    let payload = vec![b'x'; a.size];
    let ckpt = [b'c'; 64];
    let (mut tb, mut tp, mut tf, mut tc, mut tt) = (vec![], vec![], vec![], vec![], vec![]);
    let warmup = 3;
    let wall = Instant::now();
    for i in 0..a.txns + warmup {
        mark(format_args!("txn {i} begin"));
        let t0 = Instant::now();
        p.begin_transaction().expect("begin");
        let t1 = Instant::now();
        mark(format_args!("txn {i} produce"));
        for j in 0..a.k {
            let key = if a.key_spread { format!("k{}", j) } else { format!("k{}", i * a.k + j) };
            let mut rec: BaseRecord<'_, [u8], [u8], ()> =
                BaseRecord::to(&a.topic).key(key.as_bytes()).payload(&payload[..]);
            loop {
                match p.send(rec) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        rec = r;
                        p.poll(Duration::from_millis(50));
                    }
                    Err((e, _)) => panic!("send: {e}"),
                }
            }
        }
        p.poll(Duration::ZERO);
        let ck: BaseRecord<'_, [u8], [u8], ()> =
            BaseRecord::to(&a.progress).key(&b"probe"[..]).payload(&ckpt[..]).partition(0);
        p.send(ck).map_err(|(e, _)| e).expect("send checkpoint");
        let t2 = Instant::now();
        mark(format_args!("txn {i} flush"));
        if a.mode != "sink" {
            preflush(&p);
        }
        let t3 = Instant::now();
        mark(format_args!("txn {i} commit"));
        match a.mode.as_str() {
            "raw" => raw_commit(&p),
            _ => p.commit_transaction(TIMEOUT).map_err(|e| e.to_string()),
        }
        .expect("commit");
        let t4 = Instant::now();
        mark(format_args!("txn {i} committed"));
        if i >= warmup {
            let ms = |x: Instant, y: Instant| (y - x).as_secs_f64() * 1000.0;
            tb.push(ms(t0, t1));
            tp.push(ms(t1, t2));
            tf.push(ms(t2, t3));
            tc.push(ms(t3, t4));
            tt.push(ms(t0, t4));
        }
        if a.sleep_ms > 0 {
            std::thread::sleep(Duration::from_millis(a.sleep_ms));
        }
    }
    let wall = wall.elapsed().as_secs_f64();
    let ctx = p.context();
    println!(
        "mode={} k={} size={} txns={} extra={:?}  delivered={} failed={}  {:.1} txn/s",
        a.mode,
        a.k,
        a.size,
        a.txns,
        a.extra.iter().filter(|(k, _)| k != "debug").collect::<Vec<_>>(),
        ctx.delivered.load(Ordering::Relaxed),
        ctx.failed.load(Ordering::Relaxed),
        (a.txns + warmup) as f64 / wall
    );
    for (name, v) in
        [("begin", &mut tb), ("produce", &mut tp), ("preflush", &mut tf), ("commit", &mut tc), ("total", &mut tt)]
    {
        println!(
            "  {:<9} p50 {:>8.2} ms  p90 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms  mean {:>8.2} ms  >=20ms: {}",
            name,
            pct(v, 0.5),
            pct(v, 0.9),
            pct(v, 0.99),
            pct(v, 1.0),
            v.iter().sum::<f64>() / v.len() as f64,
            v.iter().filter(|x| **x >= 20.0).count()
        );
    }
}
