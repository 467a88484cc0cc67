//! The apply sink's connection: PostgreSQL's own client library, libpq (as `psql`, `postgres_fdw`
//! and `dblink` use it), so a connection string means exactly what it means to them: `service=`
//! with a service file, `passfile=` or `~/.pgpass` for the password, `sslmode`, several hosts,
//! `target_session_attrs`. Statements are sent asynchronously and waited for in slices of 100 ms,
//! so a stop request cancels a long statement instead of waiting for it.
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::time::{Duration, Instant};

use pq_sys as pq;

use super::{Rows, Target, TargetError};

/// libpq's connection options of a connection string, or libpq's reason it is not one. Values
/// are returned only for the keywords the caller asks about, so a password never leaves here.
pub fn conninfo_options(conninfo: &str, wanted: &[&str]) -> Result<Vec<(String, String)>, String> {
    let c = CString::new(conninfo).map_err(|_| "the connection string holds a NUL byte".to_string())?;
    let mut err: *mut c_char = ptr::null_mut();
    // SAFETY: `c` is a valid C string; libpq allocates the result (freed below) or the error.
    let opts = unsafe { pq::PQconninfoParse(c.as_ptr(), &mut err) };
    if opts.is_null() {
        let msg = if err.is_null() {
            "libpq could not parse it (out of memory?)".to_string()
        } else {
            // SAFETY: libpq returned a C string it allocated; freed with PQfreemem.
            let m = unsafe { CStr::from_ptr(err) }.to_string_lossy().trim().to_string();
            unsafe { pq::PQfreemem(err.cast()) };
            m
        };
        return Err(msg);
    }
    let mut out = Vec::new();
    let mut p = opts;
    // SAFETY: the array ends with an entry whose keyword is NULL.
    unsafe {
        while !(*p).keyword.is_null() {
            let key = CStr::from_ptr((*p).keyword).to_string_lossy().into_owned();
            if !(*p).val.is_null() && wanted.contains(&key.as_str()) {
                out.push((key, CStr::from_ptr((*p).val).to_string_lossy().into_owned()));
            }
            p = p.add(1);
        }
        pq::PQconninfoFree(opts);
    }
    Ok(out)
}

/// An open libpq connection.
pub struct Libpq {
    conn: *mut pq::PGconn,
    /// Checked while waiting: true cancels the statement.
    interrupt: Option<fn() -> bool>,
    /// How long one statement may take.
    timeout: Duration,
}

// SAFETY: a PGconn is used by one thread at a time (libpq is thread-safe across connections).
unsafe impl Send for Libpq {}

impl Drop for Libpq {
    fn drop(&mut self) {
        // SAFETY: conn came from PQconnectdbParams and is finished once.
        unsafe { pq::PQfinish(self.conn) };
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

/// The last error of a connection, trimmed.
fn conn_error(conn: *mut pq::PGconn) -> String {
    // SAFETY: PQerrorMessage returns a string owned by the connection.
    let m = unsafe { CStr::from_ptr(pq::PQerrorMessage(conn)) };
    m.to_string_lossy().trim().replace('\n', " ")
}

impl Libpq {
    /// Connects with `conninfo` (a connection string or URI; its own `connect_timeout` and
    /// `application_name` win over the defaults given here), then sets the session up so values
    /// in text form read back as written (ISO dates, UTC, Postgres-style intervals) and notices
    /// (`CREATE ... IF NOT EXISTS` skipping) stay out of the server log.
    pub fn connect(conninfo: &str, application_name: &str, timeout: Duration) -> Result<Libpq, TargetError> {
        let connect_timeout = timeout.as_secs().clamp(2, 60).to_string();
        let keys = [cstr("connect_timeout"), cstr("application_name"), cstr("dbname")];
        let values = [cstr(&connect_timeout), cstr(application_name), cstr(conninfo)];
        let kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).chain([ptr::null()]).collect();
        let vp: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).chain([ptr::null()]).collect();
        // SAFETY: both arrays are NULL-terminated and outlive the call; expand_dbname=1 reads the
        // connection string in dbname's place, so its keywords override the ones before it.
        let conn = unsafe { pq::PQconnectdbParams(kp.as_ptr(), vp.as_ptr(), 1) };
        if conn.is_null() {
            return Err(TargetError::connection("libpq could not allocate a connection".into()));
        }
        let mut c = Libpq { conn, interrupt: None, timeout };
        // SAFETY: conn is valid.
        if unsafe { pq::PQstatus(conn) } != pq::ConnStatusType::CONNECTION_OK {
            return Err(TargetError::connection(format!(
                "cannot connect to the target database: {}",
                conn_error(conn)
            )));
        }
        c.query(
            "SELECT set_config('datestyle', 'ISO, YMD', false), set_config('intervalstyle', 'postgres', false), \
             set_config('timezone', 'UTC', false), set_config('extra_float_digits', '3', false), \
             set_config('bytea_output', 'hex', false), set_config('client_min_messages', 'warning', false)",
            &[],
        )?;
        Ok(c)
    }

    /// For a sink a role that is not a superuser added (see [`crate::delegation`]): refuses a
    /// connection the target did not ask a password for (`trust`, `peer`, a client certificate
    /// the server's user holds), and one that is a superuser's session on this very cluster
    /// (`local_system_identifier`, as `pg_control_system()` shows it): either would give the
    /// sink's author what only the server's own user or a superuser has.
    pub fn check_delegated(&mut self, local_system_identifier: &str) -> Result<(), TargetError> {
        // SAFETY: conn is a valid, connected connection.
        let used_password = unsafe { pq::PQconnectionUsedPassword(self.conn) } == 1;
        let rows = self.query(
            "SELECT current_setting('is_superuser') = 'on', \
                    CASE WHEN current_setting('is_superuser') = 'on' \
                         THEN (SELECT system_identifier::text FROM pg_control_system()) END",
            &[],
        )?;
        let row = rows.first().cloned().unwrap_or_default();
        let superuser = row.first().cloned().flatten().as_deref() == Some("t");
        let system = row.get(1).cloned().flatten();
        match delegated_refusal(used_password, superuser, system.as_deref(), local_system_identifier) {
            None => Ok(()),
            Some(message) => Err(TargetError { sqlstate: "42501".into(), message, connection: false }),
        }
    }

    /// Checked every 100 ms while a statement runs: true cancels it.
    pub fn set_interrupt(&mut self, interrupt: fn() -> bool) {
        self.interrupt = Some(interrupt);
    }

    /// Waits until the connection's result is ready, cancelling it on interrupt or timeout.
    fn wait_ready(&mut self) -> Result<(), TargetError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            // SAFETY: conn is valid.
            if unsafe { pq::PQconsumeInput(self.conn) } == 0 {
                return Err(TargetError::connection(conn_error(self.conn)));
            }
            if unsafe { pq::PQisBusy(self.conn) } == 0 {
                return Ok(());
            }
            let stop = self.interrupt.is_some_and(|f| f());
            if stop || Instant::now() >= deadline {
                self.cancel();
                let why = if stop { "the worker is stopping" } else { "the statement timed out" };
                // Drain what is left so the connection stays usable (it is dropped anyway).
                return Err(TargetError { sqlstate: "57014".into(), message: why.into(), connection: true });
            }
            let fd = unsafe { pq::PQsocket(self.conn) };
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 100) };
        }
    }

    fn cancel(&mut self) {
        // SAFETY: conn is valid; the cancel object is freed after use.
        unsafe {
            let c = pq::PQgetCancel(self.conn);
            if !c.is_null() {
                let mut buf = [0 as c_char; 256];
                pq::PQcancel(c, buf.as_mut_ptr(), buf.len() as c_int);
                pq::PQfreeCancel(c);
            }
        }
    }
}

impl Target for Libpq {
    fn query(&mut self, sql: &str, params: &[Option<&str>]) -> Result<Rows, TargetError> {
        let sql_c = cstr(sql);
        let owned: Vec<Option<CString>> = params.iter().map(|p| p.map(cstr)).collect();
        let ptrs: Vec<*const c_char> = owned.iter().map(|p| p.as_ref().map_or(ptr::null(), |c| c.as_ptr())).collect();
        // SAFETY: the statement and every parameter are C strings that outlive the call; NULL
        // entries are SQL NULLs; all parameters are text, their types inferred by the server.
        // Without parameters the simple protocol runs it, which takes several statements.
        let sent = if ptrs.is_empty() {
            unsafe { pq::PQsendQuery(self.conn, sql_c.as_ptr()) }
        } else {
            unsafe {
                pq::PQsendQueryParams(
                    self.conn,
                    sql_c.as_ptr(),
                    ptrs.len() as c_int,
                    ptr::null(),
                    ptrs.as_ptr(),
                    ptr::null(),
                    ptr::null(),
                    0,
                )
            }
        };
        if sent == 0 {
            return Err(TargetError::connection(conn_error(self.conn)));
        }
        let mut rows: Rows = Vec::new();
        let mut failure: Option<TargetError> = None;
        loop {
            self.wait_ready()?;
            // SAFETY: not busy, so PQgetResult does not block; each result is cleared.
            let res = unsafe { pq::PQgetResult(self.conn) };
            if res.is_null() {
                break;
            }
            unsafe {
                match pq::PQresultStatus(res) {
                    pq::ExecStatusType::PGRES_TUPLES_OK => {
                        let (n, f) = (pq::PQntuples(res), pq::PQnfields(res));
                        for r in 0..n {
                            let row = (0..f)
                                .map(|c| {
                                    (pq::PQgetisnull(res, r, c) == 0).then(|| {
                                        CStr::from_ptr(pq::PQgetvalue(res, r, c)).to_string_lossy().into_owned()
                                    })
                                })
                                .collect();
                            rows.push(row);
                        }
                    }
                    pq::ExecStatusType::PGRES_COMMAND_OK | pq::ExecStatusType::PGRES_EMPTY_QUERY => {}
                    _ => {
                        let field = |code: u8| {
                            let p = pq::PQresultErrorField(res, code as c_int);
                            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
                        };
                        let sqlstate = field(b'C').unwrap_or_else(|| "XX000".into());
                        let mut message = field(b'M').unwrap_or_else(|| conn_error(self.conn));
                        if let Some(d) = field(b'D') {
                            message.push_str(&format!(" ({d})"));
                        }
                        let connection = pq::PQstatus(self.conn) != pq::ConnStatusType::CONNECTION_OK;
                        failure.get_or_insert(TargetError { sqlstate, message, connection });
                    }
                }
                pq::PQclear(res);
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }
}

/// Why a delegated sink's connection is refused, or `None` (see [`Libpq::check_delegated`]).
pub fn delegated_refusal(
    used_password: bool,
    superuser: bool,
    system_identifier: Option<&str>,
    local_system_identifier: &str,
) -> Option<String> {
    if !used_password {
        return Some(
            "the sink was added by a role that is not a superuser, and the target server did not ask for a password \
             (trust, peer or certificate authentication): only a superuser may add such a connection"
                .into(),
        );
    }
    if superuser && system_identifier == Some(local_system_identifier) {
        return Some(
            "the sink was added by a role that is not a superuser, and its connection is a superuser's session on this \
             very server: only a superuser may add such a connection"
                .into(),
        );
    }
    None
}
