//! One connection to the daemon: one session. Requests from any thread are
//! written with their own id and matched by it; a reader thread routes the
//! replies to their callers and the lock_lost/sem_lost events to the holds
//! they name, so a hold learns of its loss while its thread is busy.

use crate::error::{Error, Result};
use crate::json::Json;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread;
use std::time::Duration;

pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.write_all(b),
            Stream::Tcp(s) => s.write_all(b),
        }
    }
}

impl std::io::Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

/// Whether TARGET names a TCP address (`host:port`) rather than a socket
/// path.
pub(crate) fn is_tcp(target: &str) -> bool {
    !target.contains('/')
        && target
            .rsplit_once(':')
            .map_or(false, |(_, p)| p.parse::<u16>().is_ok())
}

fn connect_error(target: &str, e: &std::io::Error) -> Error {
    let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
        "is this user in the socket's group (listen.unix_group in leased.yml)?"
    } else if is_tcp(target) {
        "is leased running and listening there?"
    } else {
        "is leased running, and is $LEASED_SOCKET (or the path given) its listen.unix socket?"
    };
    Error::new(
        "connect",
        format!("cannot connect to leased at {}: {}; {}", target, e, hint),
    )
}

fn open_stream(target: &str, timeout: Duration) -> Result<Stream> {
    let r = if is_tcp(target) {
        TcpStream::connect(target).map(|s| {
            let _ = s.set_nodelay(true);
            let _ = s.set_write_timeout(Some(timeout));
            Stream::Tcp(s)
        })
    } else {
        UnixStream::connect(target).map(|s| {
            let _ = s.set_write_timeout(Some(timeout));
            Stream::Unix(s)
        })
    };
    r.map_err(|e| connect_error(target, &e).with_source(Box::new(e)))
}

/// Where a hold hears that it is lost: a flag with the reason, and a
/// condition variable to wait for it; also the keys of it at risk
/// (lock_at_risk until lock_safe), with a condition variable of their own.
#[derive(Default)]
pub(crate) struct LostFlag {
    reason: Mutex<Option<String>>,
    cv: Condvar,
    risky: Mutex<Vec<String>>,
    risk_cv: Condvar,
}

impl LostFlag {
    pub(crate) fn set(&self, reason: &str) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            *r = Some(reason.to_string());
        }
        self.cv.notify_all();
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_risk(&self, key: &str, at_risk: bool) {
        let mut r = self.risky.lock().unwrap_or_else(|e| e.into_inner());
        r.retain(|k| k != key);
        if at_risk {
            r.push(key.to_string());
        }
        self.risk_cv.notify_all();
    }

    pub(crate) fn at_risk(&self) -> bool {
        !self
            .risky
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Wait up to TIMEOUT until at_risk() is WANT; whether it is.
    pub(crate) fn wait_risk(&self, want: bool, timeout: Duration) -> bool {
        let r = self.risky.lock().unwrap_or_else(|e| e.into_inner());
        let (r, _) = self
            .risk_cv
            .wait_timeout_while(r, timeout, |r| r.is_empty() == want)
            .unwrap_or_else(|e| e.into_inner());
        r.is_empty() != want
    }

    pub(crate) fn wait(&self, timeout: Duration) -> Option<String> {
        let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        let (r, _) = self
            .cv
            .wait_timeout_while(r, timeout, |r| r.is_none())
            .unwrap_or_else(|e| e.into_inner());
        r.clone()
    }
}

/// What the reader thread does with the reply to an id: hand it to the
/// caller waiting for it, or, when that caller gave up, act on it (unlock
/// a late grant, give a late fill lease back).
pub(crate) type Late = Box<dyn FnOnce(&Conn, Json) + Send>;

enum Slot {
    Wait(Sender<Result<Json>>),
    Late(Late),
}

struct Watch {
    keys: Vec<String>,
    token: String,
    event: &'static str,
    flag: Weak<LostFlag>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Slot>,
    watches: Vec<Watch>,
    closed: bool,
}

pub(crate) struct Conn {
    target: String,
    writer: Mutex<Stream>,
    state: Mutex<State>,
    next_id: AtomicU64,
    dead: AtomicBool,
    pub(crate) features: Mutex<Vec<String>>,
    pub(crate) timeout: Duration,
}

/// A request written and not yet answered.
pub(crate) struct Pending {
    pub(crate) id: u64,
    rx: Receiver<Result<Json>>,
}

impl Pending {
    /// The reply, when it came and was not read.
    pub(crate) fn take(&self) -> Option<Json> {
        match self.rx.try_recv() {
            Ok(Ok(reply)) => Some(reply),
            _ => None,
        }
    }
}

impl Conn {
    /// Connect to TARGET and start the reader thread.
    pub(crate) fn open(target: &str, timeout: Duration) -> Result<Arc<Conn>> {
        let stream = open_stream(target, timeout)?;
        let reader = stream
            .try_clone()
            .map_err(|e| Error::new("io", format!("leased at {}: {}", target, e)))?;
        let conn = Arc::new(Conn {
            target: target.to_string(),
            writer: Mutex::new(stream),
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            features: Mutex::new(Vec::new()),
            timeout,
        });
        let weak = Arc::downgrade(&conn);
        thread::Builder::new()
            .name("leased-reader".into())
            .spawn(move || read_loop(reader, weak))
            .map_err(|e| Error::new("io", format!("cannot start the reader thread: {}", e)))?;
        Ok(conn)
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    pub(crate) fn has_feature(&self, name: &str) -> bool {
        self.features
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|f| f == name)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn io_error(&self, what: &str) -> Error {
        Error::new(
            "io",
            format!(
                "leased at {}: {}; the session and its locks are gone",
                self.target, what
            ),
        )
    }

    /// Write REQ (an object) with a fresh id; the reply comes through the
    /// returned Pending. A write that fails marks the connection dead:
    /// nothing of the line reached the daemon as a whole request, so the
    /// caller may send it again on a new connection.
    pub(crate) fn send(&self, req: Json) -> Result<Pending> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let line = format!("{}\n", req.set("id", Json::Int(id as i64)));
        let (tx, rx) = channel();
        {
            let mut st = self.state();
            if st.closed {
                return Err(self.io_error("the connection is closed"));
            }
            st.pending.insert(id, Slot::Wait(tx));
        }
        let res = self
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(line.as_bytes());
        if let Err(e) = res {
            self.state().pending.remove(&id);
            self.kill();
            return Err(self
                .io_error(&format!("write failed: {}", e))
                .with_source(Box::new(e)));
        }
        Ok(Pending { id, rx })
    }

    /// Send a request nobody waits for (a release after a caller gave up).
    pub(crate) fn post(&self, req: Json) {
        if let Ok(p) = self.send(req) {
            self.give_up(p.id, Box::new(|_, _| {}));
        }
    }

    /// Wait up to EXTRA past the connection's timeout for P's reply; an
    /// `"ok":false` reply is an Error.
    pub(crate) fn wait(
        &self,
        p: &Pending,
        extra: Duration,
    ) -> std::result::Result<Json, WaitError> {
        match p.rx.recv_timeout(self.timeout + extra) {
            Ok(Ok(reply)) if reply.get("ok") == Some(&Json::Bool(false)) => {
                Err(WaitError::Failed(Error::from_reply(reply)))
            }
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(WaitError::Failed(e)),
            Err(RecvTimeoutError::Timeout) => Err(WaitError::TimedOut),
            Err(RecvTimeoutError::Disconnected) => {
                Err(WaitError::Failed(self.io_error("the connection closed")))
            }
        }
    }

    /// The caller of ID stopped waiting: LATE gets its reply if one comes.
    /// Returns false when the reply came meanwhile (it is in the channel).
    pub(crate) fn give_up(&self, id: u64, late: Late) -> bool {
        let mut st = self.state();
        match st.pending.get(&id) {
            Some(Slot::Wait(_)) => {
                st.pending.insert(id, Slot::Late(late));
                true
            }
            _ => false,
        }
    }

    /// One request, one reply, within the timeout plus EXTRA.
    pub(crate) fn call(&self, req: Json, extra: Duration) -> Result<Json> {
        let op = req.str_of("op").to_string();
        let p = self.send(req)?;
        self.wait(&p, extra).map_err(|e| match e {
            WaitError::Failed(e) => e,
            WaitError::TimedOut => {
                self.give_up(p.id, Box::new(|_, _| {}));
                Error::new(
                    "timeout",
                    format!("no reply to {} from leased at {}", op, self.target),
                )
            }
        })
    }

    /// Route lock_lost (or sem_lost) events for TOKEN on KEYS to FLAG, and
    /// lock_at_risk and lock_safe (sem_*).
    pub(crate) fn watch(&self, keys: &[String], token: &str, sem: bool, flag: &Arc<LostFlag>) {
        let mut st = self.state();
        if st.closed {
            flag.set("connection_closed");
            return;
        }
        st.watches.retain(|w| w.flag.strong_count() > 0);
        st.watches.push(Watch {
            keys: keys.to_vec(),
            token: token.to_string(),
            event: if sem { "sem_lost" } else { "lock_lost" },
            flag: Arc::downgrade(flag),
        });
    }

    /// End the connection: the reader thread then fails every call still
    /// waiting and tells every hold that its session is gone.
    pub(crate) fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown();
    }

    fn on_event(&self, ev: &Json) {
        let name = ev.str_of("event");
        let (key, token) = (ev.str_of("key"), ev.str_of("token"));
        let reason = ev.get("reason").and_then(Json::as_str).unwrap_or(name);
        let st = self.state();
        for w in st.watches.iter() {
            if w.token != token || !w.keys.iter().any(|k| k == key) {
                continue;
            }
            let f = match w.flag.upgrade() {
                Some(f) => f,
                None => continue,
            };
            // "lock_" or "sem_", as the lost event of the watch.
            let kind = &w.event[..w.event.len() - "lost".len()];
            match name.strip_prefix(kind) {
                Some("lost") => f.set(reason),
                Some("at_risk") => f.set_risk(key, true),
                Some("safe") => f.set_risk(key, false),
                _ => {}
            }
        }
    }

    fn on_reply(&self, msg: Json) {
        let id = match msg.get("id").and_then(Json::as_i64) {
            Some(id) => id as u64,
            // A reply without an id answers a line the daemon could not
            // read; with one request in flight it is that request's.
            None => match self.only_pending() {
                Some(id) => id,
                None => return,
            },
        };
        let slot = self.state().pending.remove(&id);
        match slot {
            Some(Slot::Wait(tx)) => {
                let _ = tx.send(Ok(msg));
            }
            Some(Slot::Late(f)) => f(self, msg),
            None => {}
        }
    }

    fn only_pending(&self) -> Option<u64> {
        let st = self.state();
        if st.pending.len() == 1 {
            st.pending.keys().next().copied()
        } else {
            None
        }
    }

    fn on_close(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let mut st = self.state();
        st.closed = true;
        for (_, slot) in st.pending.drain() {
            if let Slot::Wait(tx) = slot {
                let _ = tx.send(Err(self.io_error("the connection closed")));
            }
        }
        for w in st.watches.drain(..) {
            if let Some(f) = w.flag.upgrade() {
                f.set("connection_closed");
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.writer
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown();
    }
}

pub(crate) enum WaitError {
    Failed(Error),
    TimedOut,
}

fn read_loop(stream: Stream, conn: Weak<Conn>) {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).unwrap_or(0);
        let c = match conn.upgrade() {
            Some(c) => c,
            None => return,
        };
        if n == 0 || !line.ends_with('\n') {
            c.on_close();
            return;
        }
        let msg = match Json::parse(&line) {
            Ok(m) => m,
            Err(_) => continue,
        };
        if msg.get("event").is_some() && msg.get("id").is_none() {
            c.on_event(&msg);
        } else {
            c.on_reply(msg);
        }
    }
}

/// Milliseconds as a Duration; a negative count (wait without limit) as
/// a very long one.
pub(crate) fn ms(n: i64) -> Duration {
    if n < 0 {
        Duration::from_secs(365 * 24 * 3600)
    } else {
        Duration::from_millis(n as u64)
    }
}
