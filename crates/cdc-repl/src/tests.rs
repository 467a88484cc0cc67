//! The client against a scripted server on a Unix socket pair: the startup and authentication
//! exchange, queries, and the stream's framing (including a message split across reads and a
//! read that times out in the middle of one). The real walsender is exercised by
//! `tests/e2e/test_replication_connection.py` and `bench/read_path.py`.
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::conn::{parse_lsn, Connection, Params};
use crate::stream::{parse_copy_data, status_update};
use crate::wire::{self, Endpoint};
use crate::{Error, StreamMessage};

fn params(password: Option<&str>) -> Params {
    Params {
        endpoint: Endpoint::unix_socket("/nonexistent", 5432),
        user: "cdc".into(),
        database: "app".into(),
        application_name: "pg_cdc test".into(),
        password: password.map(str::to_string),
        connect_timeout: Duration::from_secs(5),
    }
}

/// A client socket, and a thread playing the server side by `script` (it returns the server's
/// socket, so the connection stays open until the test joins it).
fn serve(script: impl FnOnce(&mut UnixStream) + Send + 'static) -> (UnixStream, std::thread::JoinHandle<UnixStream>) {
    let (client, mut server) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || {
        script(&mut server);
        server
    });
    (client, t)
}

/// The server side: reads one frontend message (the startup packet has no tag).
fn read_msg(s: &mut UnixStream, tagged: bool) -> (u8, Vec<u8>) {
    let mut tag = [0u8; 1];
    if tagged {
        s.read_exact(&mut tag).unwrap();
    }
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0; u32::from_be_bytes(len) as usize - 4];
    s.read_exact(&mut body).unwrap();
    (tag[0], body)
}

fn send(s: &mut UnixStream, tag: u8, body: &[u8]) {
    let mut out = Vec::new();
    wire::message(&mut out, tag, body);
    s.write_all(&out).unwrap();
}

fn auth(code: i32, extra: &[u8]) -> Vec<u8> {
    let mut b = code.to_be_bytes().to_vec();
    b.extend_from_slice(extra);
    b
}

fn ready(s: &mut UnixStream) {
    send(s, b'R', &auth(0, &[]));
    let mut key = 4242i32.to_be_bytes().to_vec();
    key.extend_from_slice(&7i32.to_be_bytes());
    send(s, b'K', &key);
    send(s, b'S', b"server_version\x0015.8\x00");
    send(s, b'Z', b"I");
}

fn error_body(code: &str, msg: &str) -> Vec<u8> {
    format!("SERROR\0C{code}\0M{msg}\0\0").into_bytes()
}

fn xlogdata(start: u64, data: &[u8]) -> Vec<u8> {
    let mut b = vec![b'w'];
    b.extend_from_slice(&start.to_be_bytes());
    b.extend_from_slice(&(start + 100).to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(data);
    b
}

#[test]
fn startup_asks_for_a_database_replication_connection_and_trusts() {
    let (client, t) = serve(move |server| {
        let (_, body) = read_msg(server, false);
        assert_eq!(&body[..4], &196_608u32.to_be_bytes());
        let text = String::from_utf8_lossy(&body[4..]).to_string();
        for kv in ["user\0cdc\0", "database\0app\0", "replication\0database\0", "application_name\0pg_cdc test\0"] {
            assert!(text.contains(kv), "{kv:?} in {text:?}");
        }
        ready(server);
    });
    let c = Connection::handshake(client, &params(None)).unwrap();
    assert_eq!(c.backend_pid, 4242);
    drop(t.join().unwrap());
}

#[test]
fn md5_answers_with_the_salted_hash() {
    let (client, t) = serve(move |server| {
        read_msg(server, false);
        send(server, b'R', &auth(5, &[1, 2, 3, 4]));
        let (tag, body) = read_msg(server, true);
        assert_eq!(tag, b'p');
        let expected = postgres_protocol::authentication::md5_hash(b"cdc", b"s3cret", [1, 2, 3, 4]);
        assert_eq!(&body[..body.len() - 1], expected.as_bytes());
        ready(server);
    });
    Connection::handshake(client, &params(Some("s3cret"))).unwrap();
    drop(t.join().unwrap());
}

#[test]
fn a_password_request_without_a_password_names_the_role_and_never_guesses() {
    let (client, t) = serve(move |server| {
        read_msg(server, false);
        send(server, b'R', &auth(10, b"SCRAM-SHA-256\0\0"));
    });
    let e = Connection::handshake(client, &params(None)).err().unwrap();
    assert!(matches!(&e, Error::Auth(m) if m.contains("role cdc") && m.contains("scram-sha-256")), "{e}");
    drop(t.join().unwrap());
}

#[test]
fn unsupported_methods_and_server_errors_are_reported() {
    let (client, t) = serve(move |server| {
        read_msg(server, false);
        send(server, b'R', &auth(7, &[])); // GSS
    });
    let e = Connection::handshake(client, &params(Some("x"))).err().unwrap();
    assert!(matches!(&e, Error::Auth(m) if m.contains("method 7")), "{e}");
    drop(t.join().unwrap());

    let (client, t) = serve(move |server| {
        read_msg(server, false);
        send(server, b'E', &error_body("28000", "no pg_hba.conf entry for replication connection"));
    });
    let e = Connection::handshake(client, &params(None)).err().unwrap();
    assert_eq!(e.sqlstate(), Some("28000"));
    assert!(e.to_string().contains("pg_hba.conf"));
    drop(t.join().unwrap());
}

#[test]
fn queries_return_text_rows_and_errors_keep_the_connection() {
    let (client, t) = serve(move |server| {
        read_msg(server, false);
        ready(server);
        let (tag, body) = read_msg(server, true);
        assert_eq!((tag, body.as_slice()), (b'Q', &b"IDENTIFY_SYSTEM\0"[..]));
        send(server, b'T', &[0, 0]);
        let mut row = 4u16.to_be_bytes().to_vec();
        for v in [Some("7301"), Some("1"), Some("0/16B3748"), None] {
            match v {
                Some(v) => {
                    row.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    row.extend_from_slice(v.as_bytes());
                }
                None => row.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        send(server, b'D', &row);
        send(server, b'C', b"IDENTIFY_SYSTEM\0");
        send(server, b'Z', b"I");
        read_msg(server, true);
        send(server, b'E', &error_body("42704", "replication slot \"x\" does not exist"));
        send(server, b'Z', b"I");
    });
    let mut c = Connection::handshake(client, &params(None)).unwrap();
    assert_eq!(c.identify_system().unwrap(), ("7301".to_string(), 1, 0x16B_3748));
    let e = c.query("DROP_REPLICATION_SLOT \"x\"").err().unwrap();
    assert_eq!(e.sqlstate(), Some("42704"));
    drop(t.join().unwrap());
}

#[test]
fn the_stream_survives_split_messages_and_timeouts_mid_message() {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (client, t) = serve(move |server| {
        read_msg(server, false);
        ready(server);
        let (_, body) = read_msg(server, true);
        let sql = String::from_utf8(body).unwrap();
        assert_eq!(
            sql,
            "START_REPLICATION SLOT \"_cdc_1\" LOGICAL 1/A0 (\"proto_version\" '1', \"publication_names\" 'a,b')\0"
        );
        send(server, b'W', &[0, 0, 0]);
        // A large frame sent in two halves, with a pause the client's deadline falls into.
        let big = vec![b'I'; 300_000];
        let mut whole = Vec::new();
        wire::message(&mut whole, b'd', &xlogdata(0x1_0000_00B0, &big));
        let (a, b) = whole.split_at(100_000);
        server.write_all(a).unwrap();
        go_rx.recv().unwrap();
        server.write_all(b).unwrap();
        let mut k = vec![b'k'];
        k.extend_from_slice(&0x1_0000_0200u64.to_be_bytes());
        k.extend_from_slice(&0i64.to_be_bytes());
        k.push(1);
        send(server, b'd', &k);
        let (tag, body) = read_msg(server, true);
        assert_eq!(tag, b'd');
        assert_eq!(body[0], b'r');
        assert_eq!(&body[1..9], &0x1_0000_0200u64.to_be_bytes());
        assert_eq!(&body[9..17], &0x1_0000_0200u64.to_be_bytes());
        send(server, b'E', &error_body("55000", "replication slot \"_cdc_1\" was dropped"));
    });
    let c = Connection::handshake(client, &params(None)).unwrap();
    let mut s =
        c.start_logical("_cdc_1", 0x1_0000_00A0, &[("proto_version", "1"), ("publication_names", "a,b")]).unwrap();
    // Half a message has arrived: the read times out and keeps it.
    assert!(s.recv(Some(Instant::now() + Duration::from_millis(100))).unwrap().is_none());
    go_tx.send(()).unwrap();
    match s.recv(None).unwrap().unwrap() {
        StreamMessage::XLogData { start, end, data } => {
            assert_eq!((start, end, data.len()), (0x1_0000_00B0, 0x1_0000_0114, 300_000));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.recv(None).unwrap(), Some(StreamMessage::Keepalive { end: 0x1_0000_0200, reply: true }));
    s.confirm(0x1_0000_0200).unwrap();
    s.confirm(0x1_0000_0100).unwrap(); // never moves back
    assert_eq!(s.confirmed(), 0x1_0000_0200);
    let e = s.recv(None).err().unwrap();
    assert_eq!(e.sqlstate(), Some("55000"));
    drop(t.join().unwrap());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert!(parse_copy_data(b"").is_err());
    assert!(parse_copy_data(b"w\0\0").is_err());
    assert!(parse_copy_data(b"k\0\0\0\0\0\0\0\x01").is_err());
    assert!(parse_copy_data(b"z").is_err());
    assert_eq!(parse_copy_data(&xlogdata(5, b"")).unwrap(), StreamMessage::XLogData { start: 5, end: 105, data: b"" });
    // A length below 4 or beyond 1 GB.
    let (client, mut server) = UnixStream::pair().unwrap();
    server.write_all(b"Z\0\0\0\x02").unwrap();
    let mut w = wire::Wire::new(client);
    assert!(matches!(w.read(None), Err(Error::Protocol(_))));
    assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
    assert_eq!(parse_lsn("16"), None);
    let s = status_update(0x10, 99, true);
    assert_eq!((s.len(), s[0], s[33]), (34, b'r', 1));
}
