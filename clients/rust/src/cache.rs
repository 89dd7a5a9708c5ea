//! The cache-aside paths: `cached()` (read, load once cluster-wide, fill)
//! and `update()`/`invalidate()` (write, then delete twice).

use crate::conn::{ms, Conn, WaitError};
use crate::{checked_keys, Error, Json, Keys, Leased, Result};
use std::sync::Arc;
use std::time::Duration;

type LoadError = Box<dyn std::error::Error + Send + Sync>;

/// Options of `cached_with`.
#[derive(Clone, Debug, Default)]
pub struct CacheOptions {
    ttl_ms: Option<i64>,
    wait_ms: Option<i64>,
    bloom: Option<String>,
}

impl CacheOptions {
    pub fn new() -> CacheOptions {
        CacheOptions::default()
    }
    /// The TTL of the filled value (the daemon's `cache.ttl_ms` without).
    pub fn ttl_ms(mut self, ms: i64) -> Self {
        self.ttl_ms = Some(ms);
        self
    }
    /// How long to wait for a load that runs elsewhere (the daemon's
    /// `cache.wait_ms`, 3000, without); past it the call fails with code
    /// `timeout` and does not load.
    pub fn wait_ms(mut self, ms: i64) -> Self {
        self.wait_ms = Some(ms);
        self
    }
    /// A Bloom filter to ask first (hello's feature `bloom`): a key it
    /// rules out is "not found" at once, the loader not called.
    pub fn bloom(mut self, filter: &str) -> Self {
        self.bloom = Some(filter.to_string());
        self
    }
}

/// A fill lease held while the loader runs: given back with
/// cache.release unless it was filled, also when the loader panics, so
/// the next reader loads at once instead of waiting the lease out.
struct Lease<'a> {
    conn: &'a Conn,
    key: &'a str,
    lease: String,
    done: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.done {
            let req = Json::object()
                .set("op", "cache.release")
                .set("key", self.key)
                .set("lease", self.lease.as_str());
            let _ = self.conn.call(req, Duration::ZERO);
        }
    }
}

/// One entry of `Leased::warm`: VALUE stored as JSON, as `cached()` stores
/// a loaded value (`Json::Null`: "not found").
#[derive(Clone, Debug)]
pub struct WarmEntry {
    key: String,
    value: Json,
    ttl_ms: Option<i64>,
}

impl WarmEntry {
    pub fn new(key: &str, value: impl Into<Json>) -> WarmEntry {
        WarmEntry {
            key: key.to_string(),
            value: value.into(),
            ttl_ms: None,
        }
    }

    /// This entry's TTL (else `warm`'s, else the daemon's cache.ttl_ms).
    pub fn ttl_ms(mut self, ms: i64) -> Self {
        self.ttl_ms = Some(ms);
        self
    }
}

/// The answer of `warm`: how many entries were stored, and each entry's
/// own error (None when it was stored), in order.
#[derive(Debug)]
pub struct Warmed {
    pub stored: i64,
    pub errors: Vec<Option<Error>>,
}

/// What `read` found (hello's feature `versioned`): `hit`, the `value` as
/// JSON (`Json::Null` for a miss or a cached "not found"), its `version`
/// (0 on a miss) and, on a miss read with a lease, the fill `lease`.
#[derive(Clone, Debug)]
pub struct Versioned {
    pub hit: bool,
    pub value: Json,
    pub version: i64,
    pub lease: Option<String>,
}

/// What `write` and `fill` did: `stored`, and the `version` the value got,
/// or, when it was not stored, the entry's current version (0: none), to
/// read again and retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub stored: bool,
    pub version: i64,
}

/// The fields of `write` and `fill` besides the value.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    ttl_ms: Option<i64>,
    if_version: Option<i64>,
}

impl WriteOptions {
    pub fn new() -> WriteOptions {
        WriteOptions::default()
    }

    /// The TTL of the value (the daemon's `cache.ttl_ms` without).
    pub fn ttl_ms(mut self, ms: i64) -> Self {
        self.ttl_ms = Some(ms);
        self
    }

    /// Store only while the entry's version is V (0: only when there is
    /// none): a compare-and-set.
    pub fn if_version(mut self, v: i64) -> Self {
        self.if_version = Some(v);
        self
    }
}

impl Leased {
    /// A cache.get that returns the value (as JSON, as `cached()` stores
    /// it) with its version, for a later `write` or `fill` with
    /// `if_version`. With `lease` a miss carries the fill lease (and may
    /// wait up to `opts.wait_ms`, as `cached()` does).
    pub fn read(&self, key: &str, lease: bool, opts: &CacheOptions) -> Result<Versioned> {
        let key = &checked_keys(vec![key.to_string()])?[0];
        let got = if lease {
            self.cache_get(key, opts)?.1
        } else {
            self.call(
                "cache.get",
                Json::object().set("key", key.as_str()).set("lease", false),
            )?
        };
        if !got.bool_of("hit") {
            return Ok(Versioned {
                hit: false,
                value: Json::Null,
                version: 0,
                lease: got.get("lease").and_then(Json::as_str).map(String::from),
            });
        }
        let value = match got.get("value").and_then(Json::as_str) {
            None => Json::Null,
            Some(text) => Json::parse(text).map_err(|e| {
                Error::new(
                    "bad_value",
                    format!("the cached value of {:?} is not JSON: {}", key, e),
                )
            })?,
        };
        Ok(Versioned {
            hit: true,
            value,
            version: got.get("version").and_then(Json::as_i64).unwrap_or(0),
            lease: None,
        })
    }

    /// cache.set of VALUE as JSON (`Json::Null`: "not found"); with
    /// `if_version` a compare-and-set.
    pub fn write(&self, key: &str, value: impl Into<Json>, opts: &WriteOptions) -> Result<Written> {
        self.versioned_write("cache.set", key, None, value.into(), opts)
    }

    /// cache.fill under LEASE (from `read` with a lease), `if_version` as
    /// `write` has it.
    pub fn fill(
        &self,
        key: &str,
        lease: &str,
        value: impl Into<Json>,
        opts: &WriteOptions,
    ) -> Result<Written> {
        self.versioned_write("cache.fill", key, Some(lease), value.into(), opts)
    }

    fn versioned_write(
        &self,
        op: &str,
        key: &str,
        lease: Option<&str>,
        value: Json,
        opts: &WriteOptions,
    ) -> Result<Written> {
        let key = &checked_keys(vec![key.to_string()])?[0];
        let text = if value.is_null() {
            Json::Null
        } else {
            Json::from(value.to_string())
        };
        let mut req = Json::object().set("key", key.as_str()).set("value", text);
        if let Some(l) = lease {
            req = req.set("lease", l);
        }
        if let Some(t) = opts.ttl_ms {
            req = req.set("ttl_ms", t);
        }
        if let Some(v) = opts.if_version {
            req = req.set("if_version", v);
        }
        let r = self.call(op, req)?;
        Ok(Written {
            stored: r.bool_of("stored"),
            version: r.get("version").and_then(Json::as_i64).unwrap_or(0),
        })
    }

    /// Bulk warm-up (`cache.mset`; hello's feature `mset`): up to 1000
    /// ENTRIES stored in one request as `cached()` would have filled them,
    /// each with its own TTL or TTL_MS (None: the daemon's default). An
    /// entry that fails alone (`bad_request`, `wrong_type`,
    /// `redis_unavailable`) is in `errors`; the others are stored all the
    /// same. A request refused as a whole is the Error.
    pub fn warm(&self, entries: &[WarmEntry], ttl_ms: Option<i64>) -> Result<Warmed> {
        if entries.is_empty() {
            return Err(Error::new("invalid", "nothing to warm"));
        }
        let list: Vec<Json> = entries
            .iter()
            .map(|e| {
                let value = if e.value.is_null() {
                    Json::Null
                } else {
                    Json::from(e.value.to_string())
                };
                let mut m = Json::object()
                    .set("key", e.key.as_str())
                    .set("value", value);
                if let Some(t) = e.ttl_ms.or(ttl_ms) {
                    m = m.set("ttl_ms", t);
                }
                m
            })
            .collect();
        let r = self.call("cache.mset", Json::object().set("entries", list))?;
        let mut errors: Vec<Option<Error>> = Vec::with_capacity(entries.len());
        if let Some(results) = r.get("results").and_then(Json::as_array) {
            for res in results {
                errors.push(if res.bool_of("ok") {
                    None
                } else {
                    Some(Error::from_reply(res.clone()))
                });
            }
        }
        errors.resize_with(entries.len(), || None);
        Ok(Warmed {
            stored: r.get("stored").and_then(Json::as_i64).unwrap_or(0),
            errors,
        })
    }

    /// The read path with values stored as JSON: the cached value, or
    /// LOADER's, loaded once cluster-wide and filled. A loader's
    /// `Json::Null` is cached as "not found" (and returned as Null).
    /// What is returned is what every reader that hits gets.
    pub fn cached<F, E>(&self, key: &str, loader: F) -> Result<Json>
    where
        F: FnOnce() -> std::result::Result<Json, E>,
        E: Into<LoadError>,
    {
        self.cached_with(key, &CacheOptions::default(), loader)
    }

    pub fn cached_with<F, E>(&self, key: &str, opts: &CacheOptions, loader: F) -> Result<Json>
    where
        F: FnOnce() -> std::result::Result<Json, E>,
        E: Into<LoadError>,
    {
        let load = || {
            loader().map(|v| {
                if v.is_null() {
                    None
                } else {
                    Some(v.to_string())
                }
            })
        };
        match self.cached_raw(key, opts, load)? {
            None => Ok(Json::Null),
            Some(text) => Json::parse(&text).map_err(|e| {
                Error::new(
                    "bad_value",
                    format!("the cached value of {:?} is not JSON: {}", key, e),
                )
            }),
        }
    }

    /// The read path with values stored as they are (strings), for keys
    /// shared with `leasectl get`/`set` or clients that store plain
    /// strings. None is "not found".
    pub fn cached_raw<F, E>(
        &self,
        key: &str,
        opts: &CacheOptions,
        loader: F,
    ) -> Result<Option<String>>
    where
        F: FnOnce() -> std::result::Result<Option<String>, E>,
        E: Into<LoadError>,
    {
        let key = &checked_keys(vec![key.to_string()])?[0];
        let (conn, got) = self.cache_get(key, opts)?;
        if got.bool_of("hit") {
            return Ok(got.get("value").and_then(Json::as_str).map(String::from));
        }
        let lease = match got.get("lease").and_then(Json::as_str) {
            Some(l) => l.to_string(),
            None => {
                return Err(Error::new(
                    "timeout",
                    format!("{:?} is still being loaded elsewhere after its wait", key),
                ))
            }
        };
        let mut held = Lease {
            conn: &conn,
            key,
            lease,
            done: false,
        };
        let value = loader().map_err(|e| {
            Error::new("loader", format!("the loader of {:?} failed", key)).with_source(e.into())
        })?;
        let mut fill = Json::object()
            .set("op", "cache.fill")
            .set("key", key.as_str())
            .set("lease", held.lease.as_str())
            .set("value", value.clone());
        if let Some(t) = opts.ttl_ms {
            fill = fill.set("ttl_ms", t);
        }
        conn.call(fill, Duration::ZERO)?;
        held.done = true;
        Ok(value)
    }

    /// cache.get with a fill lease; a lease granted after the caller gave
    /// up waiting is given back.
    fn cache_get(&self, key: &str, opts: &CacheOptions) -> Result<(Arc<Conn>, Json)> {
        let mut req = Json::object().set("op", "cache.get").set("key", key);
        if let Some(w) = opts.wait_ms {
            req = req.set("wait_ms", w);
        }
        if let Some(b) = &opts.bloom {
            req = req.set("bloom", b.as_str());
        }
        let (conn, p) = self.send(req)?;
        let wait = ms(opts.wait_ms.unwrap_or(3000));
        match conn.wait(&p, wait) {
            Ok(got) => Ok((conn, got)),
            Err(WaitError::Failed(e)) => Err(e),
            Err(WaitError::TimedOut) => {
                let k = key.to_string();
                let late = Box::new(move |c: &Conn, got: Json| {
                    if let Some(l) = got.get("lease").and_then(Json::as_str) {
                        c.post(
                            Json::object()
                                .set("op", "cache.release")
                                .set("key", k)
                                .set("lease", l),
                        );
                    }
                });
                if conn.give_up(p.id, late) && conn.has_feature("cancel") {
                    let target = p.id as i64;
                    conn.post(Json::object().set("op", "cancel").set("target", target));
                }
                Err(Error::new(
                    "timeout",
                    format!("no reply to cache.get of {:?} in time", key),
                ))
            }
        }
    }

    /// `bloom.create` (hello's feature `bloom`): the filter FILTER for
    /// CAPACITY keys at ERROR_RATE false positives. Returns the reply
    /// (`created` false when it existed alike; `bits`, `hashes`, `bytes`);
    /// other parameters than the filter has are a `bad_request`.
    pub fn bloom_create(&self, filter: &str, capacity: i64, error_rate: f64) -> Result<Json> {
        self.call(
            "bloom.create",
            Json::object()
                .set("filter", filter)
                .set("capacity", capacity)
                .set("error_rate", error_rate),
        )
    }

    /// Add KEYS (1 to 1000) to FILTER: true where the key was certainly
    /// not in it before.
    pub fn bloom_add(&self, filter: &str, keys: impl Keys) -> Result<Vec<bool>> {
        self.bloom_keys("bloom.add", "added", filter, keys)
    }

    /// Ask FILTER about KEYS: false where the key was certainly never
    /// added. A filter that does not exist is a `bad_request`.
    pub fn bloom_check(&self, filter: &str, keys: impl Keys) -> Result<Vec<bool>> {
        self.bloom_keys("bloom.check", "maybe", filter, keys)
    }

    fn bloom_keys(
        &self,
        op: &str,
        field: &str,
        filter: &str,
        keys: impl Keys,
    ) -> Result<Vec<bool>> {
        let keys = checked_keys(keys.keys())?;
        let n = keys.len();
        let r = self.call(op, Json::object().set("filter", filter).set("keys", keys))?;
        let out: Vec<bool> = r
            .get(field)
            .and_then(Json::as_array)
            .map(|a| a.iter().map(|b| b.as_bool() == Some(true)).collect())
            .unwrap_or_default();
        if out.len() != n {
            return Err(Error::new("io", format!("unreadable {} reply", op)));
        }
        Ok(out)
    }

    /// Delete KEYS (one key, or several) now and again after `delay_ms`
    /// (the daemon's `cache.double_delete_ms` without).
    pub fn invalidate(&self, keys: impl Keys) -> Result<Json> {
        self.invalidate_with(keys, None)
    }

    pub fn invalidate_with(&self, keys: impl Keys, delay_ms: Option<i64>) -> Result<Json> {
        let keys = checked_keys(keys.keys())?;
        let mut req = Json::object().set("keys", keys);
        if let Some(d) = delay_ms {
            req = req.set("delay_ms", d);
        }
        self.call("cache.invalidate", req)
    }

    /// The write path: WRITER commits to the database first, then KEYS are
    /// invalidated. Returns WRITER's result; a writer that fails
    /// invalidates nothing.
    pub fn update<T, F, E>(&self, keys: impl Keys, writer: F) -> Result<T>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: Into<LoadError>,
    {
        let keys = checked_keys(keys.keys())?;
        let out = writer()
            .map_err(|e| Error::new("loader", "the writer failed").with_source(e.into()))?;
        self.invalidate(keys)?;
        Ok(out)
    }

    /// A plain read without a lease or wait: the value, or None on a miss
    /// or a cached "not found".
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        let got = self.call(
            "cache.get",
            Json::object().set("key", key).set("lease", false),
        )?;
        Ok(got.get("value").and_then(Json::as_str).map(String::from))
    }

    /// cache.set: an unconditional write (None: "not found").
    pub fn set(&self, key: &str, value: Option<&str>, ttl_ms: Option<i64>) -> Result<()> {
        let mut req = Json::object().set("key", key).set("value", value);
        if let Some(t) = ttl_ms {
            req = req.set("ttl_ms", t);
        }
        self.call("cache.set", req).map(|_| ())
    }
}
