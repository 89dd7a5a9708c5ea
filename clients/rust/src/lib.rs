//! A client for leased, the sidecar daemon for distributed locks and
//! cache-aside over Redis. Standard library only; speaks protocol
//! version 1 (see leased-protocol(7)).
//!
//! ```no_run
//! use leased::{Leased, LockOptions};
//!
//! let ld = Leased::connect("/run/leased/leased.sock")?;
//! let held = ld.lock("order:42", &LockOptions::new().wait_ms(5000))?;
//! // ... work, checking held.is_lost(), writing with held.fence() ...
//! held.unlock()?; // or let it drop
//! # Ok::<(), leased::Error>(())
//! ```

mod conn;
mod error;
mod json;

pub use error::{Error, Result};
pub use json::Json;

use conn::{ms, Conn, Late, LostFlag, Pending, WaitError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The protocol version this client speaks.
pub const PROTOCOL: i64 = 1;

/// The socket used when none is given and LEASED_SOCKET is not set.
pub const DEFAULT_SOCKET: &str = "/run/leased/leased.sock";

/// How to reach the daemon.
#[derive(Clone, Debug)]
pub struct Options {
    /// A Unix socket path, or `host:port` for a TCP listener.
    pub target: String,
    /// The client name sent in hello (shown by `leasectl` and in logs).
    pub client: String,
    /// The `auth` of hello (a TCP listener's `listen.auth_token`).
    pub auth: Option<String>,
    /// How long a reply may take beyond the wait a request asks for.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            target: std::env::var("LEASED_SOCKET")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| DEFAULT_SOCKET.to_string()),
            client: "leased-rust".to_string(),
            auth: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// The client: `Send + Sync` and cheap to clone, so threads share one.
/// Requests of all threads go out on one connection (one session) and
/// are matched by id, so a waiting lock does not hold up the others.
/// When the connection fails (the daemon restarted), the next call opens
/// a new one, a new session: the old session's locks are gone and their
/// holds say so (`is_lost()`, reason `connection_closed`).
#[derive(Clone)]
pub struct Leased {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Leased({})", self.shared.opts.target)
    }
}

struct Shared {
    opts: Options,
    conn: Mutex<Option<Arc<Conn>>>,
    owners: AtomicU64,
}

/// Keys a call takes: one key (`"k"`) or a group (`["a", "b"]`, a Vec).
pub trait Keys {
    fn keys(self) -> Vec<String>;
}

impl Keys for &str {
    fn keys(self) -> Vec<String> {
        vec![self.to_string()]
    }
}
impl Keys for String {
    fn keys(self) -> Vec<String> {
        vec![self]
    }
}
impl Keys for &String {
    fn keys(self) -> Vec<String> {
        vec![self.clone()]
    }
}
impl<S: AsRef<str>> Keys for &[S] {
    fn keys(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}
impl<S: AsRef<str>> Keys for Vec<S> {
    fn keys(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}
impl<S: AsRef<str>, const N: usize> Keys for [S; N] {
    fn keys(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}

/// The two sides of a read-write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// The fields of a lock request. `owner`: reentry is per (session,
/// owner), and one `Leased` is one session shared by threads, so a lock
/// without an owner gets one of its own (two threads exclude each other);
/// name an owner to reenter.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    wait_ms: Option<i64>,
    ttl_ms: Option<i64>,
    owner: Option<String>,
    mode: Option<Mode>,
    detach: bool,
}

impl LockOptions {
    pub fn new() -> LockOptions {
        LockOptions::default()
    }
    /// 0: try once (the default); positive: wait that long; -1: no limit.
    pub fn wait_ms(mut self, ms: i64) -> Self {
        self.wait_ms = Some(ms);
        self
    }
    /// A fixed lease, not renewed (without it the daemon renews the lock
    /// while the session lives).
    pub fn ttl_ms(mut self, ms: i64) -> Self {
        self.ttl_ms = Some(ms);
        self
    }
    pub fn owner(mut self, owner: &str) -> Self {
        self.owner = Some(owner.to_string());
        self
    }
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }
    /// Outlive the session (needs `ttl_ms`; released by token).
    pub fn detach(mut self, detach: bool) -> Self {
        self.detach = detach;
        self
    }
}

/// The fields of `sem.acquire` besides key and limit.
#[derive(Clone, Debug)]
pub struct SemOptions {
    permits: i64,
    wait_ms: i64,
    ttl_ms: Option<i64>,
}

impl Default for SemOptions {
    fn default() -> SemOptions {
        SemOptions {
            permits: 1,
            wait_ms: 0,
            ttl_ms: None,
        }
    }
}

impl SemOptions {
    pub fn new() -> SemOptions {
        SemOptions::default()
    }
    pub fn permits(mut self, n: i64) -> Self {
        self.permits = n;
        self
    }
    pub fn wait_ms(mut self, ms: i64) -> Self {
        self.wait_ms = ms;
        self
    }
    pub fn ttl_ms(mut self, ms: i64) -> Self {
        self.ttl_ms = Some(ms);
        self
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lock,
    Sem,
}

/// A lock (or semaphore grant) held: unlocked when dropped, or by
/// `unlock()`, which says whether that worked. `is_lost()` tells when the
/// daemon reported it lost (`lock_lost`, `sem_lost`) or its session ended;
/// stop writing under it then. `is_at_risk()` tells the warning before.
pub struct Held {
    conn: Arc<Conn>,
    kind: Kind,
    keys: Vec<String>,
    owner: String,
    mode: Option<Mode>,
    reply: Json,
    lost: Arc<LostFlag>,
    released: bool,
}

impl Held {
    /// The first (or only) key.
    pub fn key(&self) -> &str {
        &self.keys[0]
    }
    pub fn keys(&self) -> &[String] {
        &self.keys
    }
    pub fn token(&self) -> &str {
        self.reply.str_of("token")
    }
    /// The fencing token of a single-key lock (0 for a group: see
    /// `fences()`).
    pub fn fence(&self) -> i64 {
        self.reply.int_of("fence")
    }
    /// The fence of each key of a group.
    pub fn fences(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        if let Some(Json::Object(m)) = self.reply.get("fences") {
            for (k, v) in m {
                out.insert(k.clone(), v.as_i64().unwrap_or(0));
            }
        }
        out
    }
    /// The hold count after this acquisition (2 on the first reentry).
    pub fn count(&self) -> i64 {
        self.reply.int_of("count")
    }
    pub fn lease_ms(&self) -> i64 {
        self.reply.int_of("lease_ms")
    }
    /// The daemon's whole reply to the lock or sem.acquire.
    pub fn reply(&self) -> &Json {
        &self.reply
    }
    pub fn is_lost(&self) -> bool {
        self.lost.get().is_some()
    }
    /// Why it was lost: the event's reason (`expired`, `taken`, ...), or
    /// `connection_closed` when the session ended.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost.get()
    }
    /// Wait up to TIMEOUT for the loss; the reason, or None.
    pub fn wait_lost(&self, timeout: Duration) -> Option<String> {
        self.lost.wait(timeout)
    }
    /// True from `lock_at_risk` (`sem_at_risk`) until `lock_safe`
    /// (`sem_safe`): a renewal failed or is late and the lease may end, so
    /// finish or pause the writes. For a group, while any key is at risk.
    pub fn is_at_risk(&self) -> bool {
        self.lost.at_risk()
    }
    /// Wait up to TIMEOUT for the hold to be at risk; whether it is.
    pub fn wait_at_risk(&self, timeout: Duration) -> bool {
        self.lost.wait_risk(true, timeout)
    }
    /// Wait up to TIMEOUT for the hold to be safe again; whether it is.
    pub fn wait_safe(&self, timeout: Duration) -> bool {
        self.lost.wait_risk(false, timeout)
    }

    /// Sets the remaining lease to TTL_MS; returns the new `lease_ms`.
    pub fn extend(&self, ttl_ms: i64) -> Result<i64> {
        let req = self.key_fields(Json::object().set("op", "extend").set("ttl_ms", ttl_ms));
        Ok(self.conn.call(req, Duration::ZERO)?.int_of("lease_ms"))
    }

    /// Release this hold (one level of a reentrant lock). A hold already
    /// reported lost is not an error: the holder was told through
    /// `is_lost()`.
    pub fn unlock(mut self) -> Result<()> {
        self.release()
    }

    fn key_fields(&self, req: Json) -> Json {
        let req = match self.keys.len() {
            1 => req.set("key", self.keys[0].as_str()),
            _ => req.set("keys", self.keys.clone()),
        };
        let req = match self.mode {
            Some(m) => req.set("mode", m.name()),
            None => req,
        };
        if self.owner.is_empty() {
            req.set("token", self.token())
        } else {
            req.set("owner", self.owner.as_str())
        }
    }

    fn release(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let req = match self.kind {
            Kind::Sem => Json::object()
                .set("op", "sem.release")
                .set("key", self.keys[0].as_str())
                .set("token", self.token()),
            Kind::Lock => self.key_fields(Json::object().set("op", "unlock")),
        };
        match self.conn.call(req, Duration::ZERO) {
            Ok(_) => Ok(()),
            Err(_) if self.is_lost() => Ok(()),
            Err(e) if e.code() == "io" => {
                // The session took the lock along; tell the hold so.
                self.lost.set("connection_closed");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({:?}, {})", self.keys, self.reply)
    }
}

/// A lock or semaphore request sent and not yet answered: `wait()` for
/// it, or end its wait from another thread with a `Canceller`.
pub struct PendingLock {
    conn: Arc<Conn>,
    pending: Pending,
    kind: Kind,
    keys: Vec<String>,
    owner: String,
    mode: Option<Mode>,
    wait: Duration,
}

/// Ends the wait of a `PendingLock` (the protocol's `cancel`): its
/// `wait()` then returns `None`, and nothing is acquired after the cancel
/// answered.
#[derive(Clone)]
pub struct Canceller {
    conn: Arc<Conn>,
    id: u64,
}

impl Canceller {
    /// Returns whether a wait was ended (false: it had been answered).
    pub fn cancel(&self) -> Result<bool> {
        let req = Json::object()
            .set("op", "cancel")
            .set("target", self.id as i64);
        Ok(self.conn.call(req, Duration::ZERO)?.bool_of("cancelled"))
    }
}

impl PendingLock {
    pub fn canceller(&self) -> Canceller {
        Canceller {
            conn: self.conn.clone(),
            id: self.pending.id,
        }
    }

    /// The hold, or None when it was not acquired within its wait (or the
    /// wait was cancelled). When no reply comes in time, the request is
    /// cancelled (where the daemon offers cancel) and a grant that still
    /// comes is released: a timed-out wait never leaks a lock.
    pub fn wait(self) -> Result<Option<Held>> {
        let reply = match self.conn.wait(&self.pending, self.wait) {
            Ok(r) => r,
            Err(WaitError::Failed(e)) => return Err(e),
            Err(WaitError::TimedOut) => return Err(self.timed_out()),
        };
        if !reply.bool_of("acquired") {
            return Ok(None);
        }
        let lost = Arc::new(LostFlag::default());
        self.conn.watch(
            &self.keys,
            reply.str_of("token"),
            self.kind == Kind::Sem,
            &lost,
        );
        Ok(Some(Held {
            conn: self.conn.clone(),
            kind: self.kind,
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            mode: self.mode,
            reply,
            lost,
            released: false,
        }))
    }

    fn timed_out(&self) -> Error {
        Error::new(
            "timeout",
            format!("no reply to the lock of {:?} in time", self.keys),
        )
    }
}

impl Drop for PendingLock {
    /// A request whose caller stopped waiting (it timed out, or dropped
    /// the PendingLock unanswered) is cancelled where the daemon offers
    /// cancel, and a grant that still comes, or came unread, is released.
    fn drop(&mut self) {
        let late = || release_late(self.kind, self.keys.clone(), self.mode);
        if self.conn.give_up(self.pending.id, late()) {
            if self.conn.has_feature("cancel") {
                let req = Json::object()
                    .set("op", "cancel")
                    .set("target", self.pending.id as i64);
                self.conn.post(req);
            }
        } else if let Some(reply) = self.pending.take() {
            late()(&self.conn, reply);
        }
    }
}

/// What to do with a grant that comes after its caller gave up: release
/// it by token.
fn release_late(kind: Kind, keys: Vec<String>, mode: Option<Mode>) -> Late {
    Box::new(move |conn: &Conn, reply: Json| {
        if !reply.bool_of("acquired") {
            return;
        }
        let op = if kind == Kind::Sem {
            "sem.release"
        } else {
            "unlock"
        };
        let mut req = Json::object()
            .set("op", op)
            .set("token", reply.str_of("token"));
        req = match keys.len() {
            1 => req.set("key", keys[0].as_str()),
            _ => req.set("keys", keys),
        };
        if let Some(m) = mode {
            req = req.set("mode", m.name());
        }
        conn.post(req);
    })
}

mod cache;
pub use cache::{CacheOptions, Versioned, WarmEntry, Warmed, WriteOptions, Written};

impl Leased {
    /// Connect to the daemon at TARGET (a Unix socket path, or
    /// `host:port`) and say hello.
    pub fn connect(target: &str) -> Result<Leased> {
        Leased::with_options(Options {
            target: target.to_string(),
            ..Options::default()
        })
    }

    /// Connect to LEASED_SOCKET (default /run/leased/leased.sock).
    pub fn from_env() -> Result<Leased> {
        Leased::with_options(Options::default())
    }

    pub fn with_options(opts: Options) -> Result<Leased> {
        let ld = Leased {
            shared: Arc::new(Shared {
                opts,
                conn: Mutex::new(None),
                owners: AtomicU64::new(0),
            }),
        };
        ld.conn()?;
        Ok(ld)
    }

    /// The features the daemon announced in hello (`cancel`, `rwlock`,
    /// `semaphore`, `multilock`, ...).
    pub fn features(&self) -> Result<Vec<String>> {
        Ok(self
            .conn()?
            .features
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone())
    }

    /// The current connection, or a new one (with hello) when there is
    /// none or the last one failed.
    fn conn(&self) -> Result<Arc<Conn>> {
        let mut slot = self.shared.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        let o = &self.shared.opts;
        let c = Conn::open(&o.target, o.timeout)?;
        let mut hello = Json::object()
            .set("op", "hello")
            .set("client", o.client.as_str());
        if let Some(a) = &o.auth {
            hello = hello.set("auth", a.as_str());
        }
        let reply = c.call(hello, Duration::ZERO)?;
        if let Some(fs) = reply.get("features").and_then(Json::as_array) {
            *c.features.lock().unwrap_or_else(|e| e.into_inner()) = fs
                .iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect();
        }
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Send REQ; when the write finds the connection gone (the daemon
    /// restarted while it was idle), send it once more on a new one.
    fn send(&self, req: Json) -> Result<(Arc<Conn>, Pending)> {
        let c = self.conn()?;
        match c.send(req.clone()) {
            Ok(p) => Ok((c, p)),
            Err(e) if e.code() == "io" => {
                let c = self.conn()?;
                let p = c.send(req)?;
                Ok((c, p))
            }
            Err(e) => Err(e),
        }
    }

    /// Any op of the protocol: FIELDS (an object) with `op` set. An
    /// `"ok":false` reply is an Error with its code.
    pub fn call(&self, op: &str, fields: Json) -> Result<Json> {
        let wait = fields.get("wait_ms").and_then(Json::as_i64).unwrap_or(0);
        let (c, p) = self.send(fields.set("op", op))?;
        c.wait(&p, ms(wait)).map_err(|e| match e {
            WaitError::Failed(e) => e,
            WaitError::TimedOut => {
                c.give_up(p.id, Box::new(|_, _| {}));
                Error::new("timeout", format!("no reply to {} in time", op))
            }
        })
    }

    /// End the session now: its session-bound locks are released and
    /// their holds report `connection_closed`. A later call opens a new
    /// connection.
    pub fn close(&self) {
        if let Some(c) = self
            .shared
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            c.kill();
        }
    }

    pub fn ping(&self) -> Result<()> {
        self.call("ping", Json::object()).map(|_| ())
    }

    fn new_owner(&self) -> String {
        format!(
            "rs-{}",
            self.shared.owners.fetch_add(1, Ordering::SeqCst) + 1
        )
    }

    /// Send a lock request and return at once; see `PendingLock`.
    pub fn start_lock(&self, keys: impl Keys, opts: &LockOptions) -> Result<PendingLock> {
        let keys = checked_keys(keys.keys())?;
        let owner = opts.owner.clone().unwrap_or_else(|| self.new_owner());
        let mut req = Json::object()
            .set("op", "lock")
            .set("owner", owner.as_str());
        req = match keys.len() {
            1 => req.set("key", keys[0].as_str()),
            _ => req.set("keys", keys.clone()),
        };
        let wait = opts.wait_ms.unwrap_or(0);
        req = req.set("wait_ms", wait);
        if let Some(t) = opts.ttl_ms {
            req = req.set("ttl_ms", t);
        }
        if let Some(m) = opts.mode {
            req = req.set("mode", m.name());
        }
        if opts.detach {
            req = req.set("detach", true);
        }
        let (conn, pending) = self.send(req)?;
        Ok(PendingLock {
            conn,
            pending,
            kind: Kind::Lock,
            keys,
            // A detached lock is released by token, from any session.
            owner: if opts.detach { String::new() } else { owner },
            mode: opts.mode,
            wait: ms(wait),
        })
    }

    /// The lock, or None when it was not acquired within `wait_ms`.
    pub fn try_lock(&self, keys: impl Keys, opts: &LockOptions) -> Result<Option<Held>> {
        self.start_lock(keys, opts)?.wait()
    }

    /// The lock, or an Error with code `not_acquired`.
    pub fn lock(&self, keys: impl Keys, opts: &LockOptions) -> Result<Held> {
        let keys = keys.keys();
        let what = format!("{:?}", keys);
        self.try_lock(keys, opts)?.ok_or_else(|| {
            Error::new(
                "not_acquired",
                format!("lock {} is held by another owner", what),
            )
        })
    }

    /// The read side of the read-write lock KEY.
    pub fn read_lock(&self, key: &str, opts: &LockOptions) -> Result<Held> {
        self.lock(key, &opts.clone().mode(Mode::Read))
    }

    /// The write side of the read-write lock KEY.
    pub fn write_lock(&self, key: &str, opts: &LockOptions) -> Result<Held> {
        self.lock(key, &opts.clone().mode(Mode::Write))
    }

    /// Unlock by token, from any session (a detached lock, or one whose
    /// `Held` was forgotten).
    pub fn unlock_token(&self, keys: impl Keys, token: &str) -> Result<Json> {
        let keys = checked_keys(keys.keys())?;
        let req = match keys.len() {
            1 => Json::object().set("key", keys[0].as_str()),
            _ => Json::object().set("keys", keys),
        };
        self.call("unlock", req.set("token", token))
    }

    /// Release one hold of KEY named by `opts` (owner on this session, or
    /// token from any), outside of a `Held`: for an unlock that must be
    /// safe to repeat (`UnlockOptions::request_id`).
    pub fn unlock_with(&self, key: &str, opts: &UnlockOptions) -> Result<Unlocked> {
        let key = &checked_keys(vec![key.to_string()])?[0];
        if opts.owner.is_none() && opts.token.is_none() {
            return Err(Error::new("invalid", "unlock needs an owner or a token"));
        }
        let mut req = Json::object().set("key", key.as_str());
        if let Some(o) = &opts.owner {
            req = req.set("owner", o.as_str());
        }
        if let Some(t) = &opts.token {
            req = req.set("token", t.as_str());
        }
        if let Some(m) = opts.mode {
            req = req.set("mode", m.name());
        }
        if let Some(r) = &opts.request_id {
            req = req.set("request_id", r.as_str());
        }
        let r = self.call("unlock", req)?;
        Ok(Unlocked {
            released: r.bool_of("released"),
            count: r.get("count").and_then(Json::as_i64).unwrap_or(0),
        })
    }

    /// `rate.acquire`: take `opts.permits` from the rate limiter KEY, which
    /// allows RATE permits every PER_MS milliseconds (GCRA decided on Redis
    /// time, exact across daemons). A refusal is `acquired` false, not an
    /// error; a `redis_unavailable` whose `outcome_unknown()` may have
    /// granted.
    pub fn rate_acquire(
        &self,
        key: &str,
        rate: i64,
        per_ms: i64,
        opts: &RateOptions,
    ) -> Result<RateGrant> {
        let key = &checked_keys(vec![key.to_string()])?[0];
        let mut req = Json::object()
            .set("key", key.as_str())
            .set("rate", rate)
            .set("per_ms", per_ms);
        if let Some(b) = opts.burst {
            req = req.set("burst", b);
        }
        if opts.permits != 1 {
            req = req.set("permits", opts.permits);
        }
        if opts.wait_ms != 0 {
            req = req.set("wait_ms", opts.wait_ms);
        }
        let r = self.call("rate.acquire", req)?;
        Ok(RateGrant {
            acquired: r.bool_of("acquired"),
            retry_after_ms: r.get("retry_after_ms").and_then(Json::as_i64).unwrap_or(0),
        })
    }

    /// Send a sem.acquire and return at once; see `PendingLock`.
    pub fn start_semaphore(&self, key: &str, limit: i64, opts: &SemOptions) -> Result<PendingLock> {
        let keys = checked_keys(vec![key.to_string()])?;
        let mut req = Json::object()
            .set("op", "sem.acquire")
            .set("key", key)
            .set("limit", limit)
            .set("permits", opts.permits)
            .set("wait_ms", opts.wait_ms);
        if let Some(t) = opts.ttl_ms {
            req = req.set("ttl_ms", t);
        }
        let (conn, pending) = self.send(req)?;
        Ok(PendingLock {
            conn,
            pending,
            kind: Kind::Sem,
            keys,
            owner: String::new(),
            mode: None,
            wait: ms(opts.wait_ms),
        })
    }

    /// A grant of `permits` of the LIMIT permits of KEY, or None.
    pub fn try_semaphore(&self, key: &str, limit: i64, opts: &SemOptions) -> Result<Option<Held>> {
        self.start_semaphore(key, limit, opts)?.wait()
    }

    /// A grant, or an Error with code `no_permit`.
    pub fn semaphore(&self, key: &str, limit: i64, opts: &SemOptions) -> Result<Held> {
        self.try_semaphore(key, limit, opts)?.ok_or_else(|| {
            Error::new(
                "no_permit",
                format!("no permit of {:?} (limit {}) in time", key, limit),
            )
        })
    }

    /// `sem.info`: `available` and `held`.
    pub fn sem_info(&self, key: &str, limit: i64) -> Result<Json> {
        self.call(
            "sem.info",
            Json::object().set("key", key).set("limit", limit),
        )
    }
}

/// Which lock `Leased::unlock_with` releases, and how.
#[derive(Clone, Debug, Default)]
pub struct UnlockOptions {
    owner: Option<String>,
    token: Option<String>,
    mode: Option<Mode>,
    request_id: Option<String>,
}

impl UnlockOptions {
    pub fn new() -> UnlockOptions {
        UnlockOptions::default()
    }

    /// The owner that locked, on this session.
    pub fn owner(mut self, owner: &str) -> Self {
        self.owner = Some(owner.to_string());
        self
    }

    /// The lock's token (any session; a detached lock).
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self
    }

    /// A side of a read-write lock.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// 1 to 64 printable ASCII characters, unique among the unlocks of one
    /// hold: sent again with the same id after a lost answer (`io`,
    /// `timeout`, or `outcome_unknown()`), the unlock gets the first answer
    /// and releases no second hold.
    pub fn request_id(mut self, id: &str) -> Self {
        self.request_id = Some(id.to_string());
        self
    }
}

/// The answer of an unlock: `released` when the lock is free now, else
/// the hold `count` left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unlocked {
    pub released: bool,
    pub count: i64,
}

/// The fields of `rate.acquire` besides key, rate and per_ms.
#[derive(Clone, Debug)]
pub struct RateOptions {
    burst: Option<i64>,
    permits: i64,
    wait_ms: i64,
}

impl Default for RateOptions {
    fn default() -> Self {
        RateOptions {
            burst: None,
            permits: 1,
            wait_ms: 0,
        }
    }
}

impl RateOptions {
    pub fn new() -> RateOptions {
        RateOptions::default()
    }

    /// How many permits may be taken at once after a quiet spell (the
    /// daemon's default: the rate).
    pub fn burst(mut self, n: i64) -> Self {
        self.burst = Some(n);
        self
    }

    /// Taken all or none (default 1).
    pub fn permits(mut self, n: i64) -> Self {
        self.permits = n;
        self
    }

    /// Let the daemon try again when the permits will be free, up to this
    /// long (default 0: decide once).
    pub fn wait_ms(mut self, ms: i64) -> Self {
        self.wait_ms = ms;
        self
    }
}

/// The answer of `rate.acquire`: `retry_after_ms` is, when refused, how
/// long until the permits could be granted; when granted, until one more
/// could be (0: one is free now).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateGrant {
    pub acquired: bool,
    pub retry_after_ms: i64,
}

/// KEYS, or an `invalid` Error when there is none (the daemon judges
/// each key: an empty one is its `bad_request`).
fn checked_keys(keys: Vec<String>) -> Result<Vec<String>> {
    if keys.is_empty() {
        return Err(Error::new("invalid", "a list of keys is not empty"));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    fn is_send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_between_threads() {
        is_send_sync::<super::Leased>();
        is_send_sync::<super::Canceller>();
        is_send_sync::<super::Error>();
        fn is_send<T: Send>() {}
        is_send::<super::Held>();
    }
}
