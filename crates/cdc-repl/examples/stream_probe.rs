//! Streams a logical slot over a replication connection and prints what it took: the read-path
//! prototype `bench/read_path.py` measures against the peek, and the client the e2e test
//! `tests/e2e/test_replication_connection.py` checks against a real walsender. Nothing is
//! confirmed unless `--confirm` is given (then the end of the transaction of the last expected
//! change, read up to its Commit), so the slot
//! can be read again. `--dump FILE` writes each message as `<lsn>\t<hex>`, the peek's two columns.
//! The password, if the server asks for one, comes from `PGPASSWORD`.
//!
//! ```text
//! stream_probe <socket dir | host> <port> <user> <database> <slot> <publications> <expected changes> [--confirm] [--dump FILE]
//! ```
//! Prints one JSON line: frames, bytes, the changes (Insert/Update/Delete) seen, elapsed seconds,
//! this process's CPU seconds and the walsender's (read from /proc before the connection closes:
//! run it on the database host) and the walsender's pid.
use std::time::{Duration, Instant};

use cdc_repl::{Connection, Endpoint, Params, StreamMessage};

fn cpu_seconds_of(proc_dir: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("{proc_dir}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 =
        f.get(11).and_then(|s| s.parse().ok()).unwrap_or(0.0) + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// Prints the error (with its SQLSTATE, for the tests) and exits 1.
fn fail(e: &cdc_repl::Error) -> ! {
    eprintln!("stream_probe: {e} [{}]", e.sqlstate().unwrap_or("-"));
    std::process::exit(1);
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 8 {
        eprintln!(
            "usage: stream_probe <socket dir | host> <port> <user> <database> <slot> <publications> <expected changes> \
             [--confirm] [--dump FILE]"
        );
        std::process::exit(2);
    }
    let params = Params {
        endpoint: if a[1].starts_with('/') {
            Endpoint::unix_socket(&a[1], a[2].parse().expect("port"))
        } else {
            Endpoint::Tcp(a[1].clone(), a[2].parse().expect("port"))
        },
        user: a[3].clone(),
        database: a[4].clone(),
        application_name: "pg_cdc_stream_probe".into(),
        password: std::env::var("PGPASSWORD").ok(),
        connect_timeout: Duration::from_secs(10),
    };
    let expected: u64 = a[7].parse().expect("expected changes");
    let confirm = a.iter().any(|x| x == "--confirm");
    let mut dump = a
        .iter()
        .position(|x| x == "--dump")
        .map(|i| std::io::BufWriter::new(std::fs::File::create(&a[i + 1]).expect("--dump file")));
    let t0 = Instant::now();
    let cpu0 = cpu_seconds_of("/proc/self");
    let conn = Connection::connect(&params).unwrap_or_else(|e| fail(&e));
    let pid = conn.backend_pid;
    let opts = [("proto_version", "1"), ("publication_names", a[6].as_str()), ("messages", "true")];
    let mut s = conn.start_logical(&a[5], 0, &opts).unwrap_or_else(|e| fail(&e));
    let (mut frames, mut bytes, mut changes, mut last_end) = (0u64, 0u64, 0u64, 0u64);
    // Until the Commit of the transaction holding the last expected change.
    let mut at_commit = false;
    while changes < expected || !at_commit {
        match s.recv(Some(Instant::now() + Duration::from_secs(30))).unwrap_or_else(|e| fail(&e)) {
            Some(StreamMessage::XLogData { start, data, .. }) => {
                if let Some(d) = dump.as_mut() {
                    use std::io::Write;
                    let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
                    writeln!(d, "{start}\t{hex}").expect("--dump write");
                }
                frames += 1;
                bytes += data.len() as u64;
                if matches!(data.first(), Some(b'I' | b'U' | b'D')) {
                    changes += 1;
                }
                at_commit = data.first() == Some(&b'C');
                if at_commit {
                    last_end = start;
                }
            }
            Some(StreamMessage::Keepalive { reply: true, .. }) => s.send_status(false).unwrap(),
            Some(StreamMessage::Keepalive { .. }) => {}
            None => {
                eprintln!("no change for 30 s after {changes} changes");
                std::process::exit(1);
            }
        }
    }
    drop(dump);
    if confirm {
        s.confirm(last_end).unwrap();
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds_of("/proc/self") - cpu0;
    // The walsender started with this connection: its CPU is all this stream's decoding.
    let walsender_cpu = cpu_seconds_of(&format!("/proc/{pid}"));
    s.close();
    println!(
        "{{\"frames\":{frames},\"bytes\":{bytes},\"changes\":{changes},\"elapsed_s\":{elapsed:.3},\"client_cpu_s\":{cpu:.3},\"walsender_cpu_s\":{walsender_cpu:.3},\"walsender_pid\":{pid}}}"
    );
}
