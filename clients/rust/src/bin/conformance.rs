//! The conformance runner of the Rust client: carries out the scenarios
//! of clients/conformance (see its README for the format) with the
//! client's public API.
//!
//!     leased-conformance FILE...         run the scenarios, print ok/not ok
//!     leased-conformance --steps JSON    helper mode: run the steps, exit 0/1

use leased::{
    CacheOptions, Canceller, Error, Held, Json, Leased, LockOptions, Mode, Options, RateOptions,
    SemOptions, UnlockOptions, WarmEntry,
};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

type StepResult = Result<Json, String>;

/// What a background lock gives its `await`: the result and the hold.
type Outcome = (Json, Option<Held>);

struct Background {
    started: Instant,
    thread: JoinHandle<Outcome>,
    canceller: Canceller,
}

#[derive(Default)]
struct Run {
    clients: HashMap<String, Leased>,
    held: HashMap<String, Held>,
    saved: HashMap<String, Json>,
    background: HashMap<String, Background>,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn field<'a>(step: &'a Json, name: &str) -> &'a str {
    step.get(name).and_then(Json::as_str).unwrap_or("")
}

fn int(step: &Json, name: &str) -> Option<i64> {
    step.get(name).and_then(Json::as_i64)
}

fn error_result(e: &Error) -> Json {
    Json::object().set("error", e.code())
}

/// One request on the control channel: connect, one line out, one in.
fn control(step: &Json) -> StepResult {
    let path = env("LEASED_CONTROL");
    let mut s =
        UnixStream::connect(&path).map_err(|e| format!("control channel {}: {}", path, e))?;
    s.write_all(format!("{}\n", step).as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let reply = Json::parse(&line).map_err(|e| format!("control reply {:?}: {}", line, e))?;
    if reply.get("ok").and_then(Json::as_bool) == Some(true) {
        Ok(reply)
    } else {
        Err(format!(
            "env {}: {}",
            field(step, "action"),
            reply.get("error").map_or(String::new(), |e| e.to_string())
        ))
    }
}

fn tmp_file(name: &str) -> String {
    format!("{}/{}", env("LEASED_CONF_TMP"), name)
}

fn append_line(name: &str) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(tmp_file(name))?;
    f.write_all(b"x\n")
}

fn count_lines(name: &str) -> i64 {
    std::fs::read_to_string(tmp_file(name)).map_or(0, |s| s.lines().count() as i64)
}

/// The loader of a `cached` step.
fn load(spec: &Json) -> Result<Json, Box<dyn std::error::Error + Send + Sync>> {
    if let Some(f) = spec.get("count_file").and_then(Json::as_str) {
        append_line(f)?;
    }
    if let Some(m) = spec.get("mark").and_then(Json::as_str) {
        control(
            &Json::object()
                .set("do", "env")
                .set("action", "mark")
                .set("name", m),
        )?;
    }
    if let Some(d) = int(spec, "delay_ms") {
        // The database's time to answer.
        thread::sleep(Duration::from_millis(d as u64));
    }
    Ok(Json::from(field(spec, "value")))
}

fn keys_of(step: &Json) -> Vec<String> {
    match step.get("keys").and_then(Json::as_array) {
        Some(a) => a
            .iter()
            .filter_map(|k| k.as_str().map(String::from))
            .collect(),
        None => vec![field(step, "key").to_string()],
    }
}

fn lock_options(step: &Json) -> LockOptions {
    let mut o = LockOptions::new();
    if let Some(w) = int(step, "wait_ms") {
        o = o.wait_ms(w);
    }
    if let Some(t) = int(step, "ttl_ms") {
        o = o.ttl_ms(t);
    }
    if let Some(owner) = step.get("owner").and_then(Json::as_str) {
        o = o.owner(owner);
    }
    match field(step, "mode") {
        "read" => o.mode(Mode::Read),
        "write" => o.mode(Mode::Write),
        _ => o,
    }
}

/// The result of a lock or sem step from what the client gave back.
fn acquired(r: leased::Result<Option<Held>>) -> Outcome {
    match r {
        Ok(Some(h)) => {
            let mut res = Json::object()
                .set("acquired", true)
                .set("token", h.token())
                .set("count", h.count());
            if h.keys().len() == 1 && h.reply().get("fence").is_some() {
                res = res.set("fence", h.fence());
            }
            (res, Some(h))
        }
        Ok(None) => (Json::object().set("acquired", false), None),
        Err(e) => (error_result(&e), None),
    }
}

impl Run {
    fn client(&self, step: &Json) -> Result<&Leased, String> {
        let name = field(step, "client");
        self.clients
            .get(name)
            .ok_or_else(|| format!("no client {:?}", name))
    }

    fn open(&mut self, step: &Json) -> StepResult {
        let mut o = Options {
            client: "conformance-rust".to_string(),
            ..Options::default()
        };
        match field(step, "target") {
            "tcp" => o.target = env("LEASED_TCP"),
            "dead" => o.target = env("LEASED_DEAD_SOCKET"),
            _ => o.target = env("LEASED_SOCKET"),
        }
        if step.get("auth").and_then(Json::as_bool) == Some(true) {
            o.auth = Some(env("LEASED_AUTH_TOKEN"));
        }
        match Leased::with_options(o) {
            Ok(c) => {
                self.clients.insert(field(step, "as").to_string(), c);
                Ok(Json::object())
            }
            Err(e) => Ok(error_result(&e)),
        }
    }

    fn keep(&mut self, step: &Json, out: Outcome) -> Json {
        let (res, held) = out;
        if let Some(h) = held {
            self.held.insert(field(step, "as").to_string(), h);
        }
        res
    }

    fn lock(&mut self, step: &Json) -> StepResult {
        let c = self.client(step)?.clone();
        let opts = lock_options(step);
        if step.get("background").and_then(Json::as_bool) != Some(true) {
            let out = acquired(c.try_lock(keys_of(step), &opts));
            return Ok(self.keep(step, out));
        }
        let started = Instant::now();
        let pending = c
            .start_lock(keys_of(step), &opts)
            .map_err(|e| e.to_string())?;
        let canceller = pending.canceller();
        let thread = thread::spawn(move || acquired(pending.wait()));
        let bg = Background {
            started,
            thread,
            canceller,
        };
        self.background.insert(field(step, "as").to_string(), bg);
        Ok(Json::object())
    }

    fn sem(&mut self, step: &Json) -> StepResult {
        let c = self.client(step)?;
        let opts = SemOptions::new()
            .permits(int(step, "permits").unwrap_or(1))
            .wait_ms(int(step, "wait_ms").unwrap_or(0));
        let out =
            acquired(c.try_semaphore(field(step, "key"), int(step, "limit").unwrap_or(1), &opts));
        Ok(self.keep(step, out))
    }

    fn await_op(&mut self, step: &Json) -> StepResult {
        let name = field(step, "op");
        let bg = self
            .background
            .remove(name)
            .ok_or_else(|| format!("no background op {:?}", name))?;
        let (res, held) = bg
            .thread
            .join()
            .map_err(|_| "the background lock panicked".to_string())?;
        if let Some(h) = held {
            self.held.insert(name.to_string(), h);
        }
        Ok(res.set("elapsed_ms", bg.started.elapsed().as_millis() as i64))
    }

    fn cached(&mut self, step: &Json) -> StepResult {
        let c = self.client(step)?;
        let spec = step.get("loader").cloned().unwrap_or_else(Json::object);
        match c.cached_with(field(step, "key"), &CacheOptions::new(), || load(&spec)) {
            Ok(v) => Ok(Json::object().set("value", v)),
            Err(e) => Ok(error_result(&e)),
        }
    }

    fn rate(&mut self, step: &Json) -> StepResult {
        let mut o = RateOptions::new()
            .permits(int(step, "permits").unwrap_or(1))
            .wait_ms(int(step, "wait_ms").unwrap_or(0));
        if let Some(b) = int(step, "burst") {
            o = o.burst(b);
        }
        let c = self.client(step)?;
        let got = c.rate_acquire(
            field(step, "key"),
            int(step, "rate").unwrap_or(0),
            int(step, "per_ms").unwrap_or(0),
            &o,
        );
        Ok(got.map_or_else(
            |e| error_result(&e),
            |g| {
                Json::object()
                    .set("acquired", g.acquired)
                    .set("retry_after_ms", g.retry_after_ms)
            },
        ))
    }

    /// stored, failed (entries with their own error) and the first one's
    /// code.
    fn warm(&mut self, step: &Json) -> StepResult {
        let entries: Vec<WarmEntry> = step
            .get("entries")
            .and_then(Json::as_array)
            .map_or(&[][..], |a| &a[..])
            .iter()
            .map(|e| {
                let w = WarmEntry::new(
                    field(e, "key"),
                    e.get("value").cloned().unwrap_or(Json::Null),
                );
                match int(e, "ttl_ms") {
                    Some(t) => w.ttl_ms(t),
                    None => w,
                }
            })
            .collect();
        let w = match self.client(step)?.warm(&entries, None) {
            Ok(w) => w,
            Err(e) => return Ok(error_result(&e)),
        };
        let failed: Vec<&Error> = w.errors.iter().flatten().collect();
        let mut r = Json::object()
            .set("stored", w.stored)
            .set("failed", failed.len() as i64);
        if let Some(e) = failed.first() {
            r = r.set("first_error", e.code());
        }
        Ok(r)
    }

    fn unlock_id(&mut self, step: &Json) -> StepResult {
        let o = UnlockOptions::new()
            .owner(field(step, "owner"))
            .request_id(field(step, "request_id"));
        let got = self.client(step)?.unlock_with(field(step, "key"), &o);
        Ok(got.map_or_else(
            |e| error_result(&e),
            |u| {
                Json::object()
                    .set("released", u.released)
                    .set("count", u.count)
            },
        ))
    }

    fn unlock(&mut self, step: &Json) -> StepResult {
        let name = field(step, "held");
        let h = self
            .held
            .remove(name)
            .ok_or_else(|| format!("no held {:?}", name))?;
        Ok(h.unlock()
            .map_or_else(|e| error_result(&e), |_| Json::object()))
    }

    fn wait_lost(&mut self, step: &Json) -> StepResult {
        let name = field(step, "held");
        let h = self
            .held
            .get(name)
            .ok_or_else(|| format!("no held {:?}", name))?;
        let within = Duration::from_millis(int(step, "within_ms").unwrap_or(5000) as u64);
        match h.wait_lost(within) {
            Some(reason) => Ok(Json::object().set("reason", reason)),
            None => Err(format!("{:?} was not lost within {:?}", name, within)),
        }
    }

    fn wait_risk(&mut self, step: &Json, at_risk: bool) -> StepResult {
        let name = field(step, "held");
        let h = self
            .held
            .get(name)
            .ok_or_else(|| format!("no held {:?}", name))?;
        let within = Duration::from_millis(int(step, "within_ms").unwrap_or(5000) as u64);
        let reached = if at_risk {
            h.wait_at_risk(within)
        } else {
            h.wait_safe(within)
        };
        if !reached || h.is_lost() {
            let what = if at_risk { "at risk" } else { "safe" };
            return Err(format!("{:?} was not {} within {:?}", name, what, within));
        }
        Ok(Json::object())
    }

    fn step(&mut self, step: &Json) -> StepResult {
        let done =
            |r: leased::Result<Json>| Ok(r.map_or_else(|e| error_result(&e), |_| Json::object()));
        match field(step, "do") {
            "env" => control(step),
            "open" => self.open(step),
            "close" => {
                self.client(step)?.close();
                Ok(Json::object())
            }
            "lock" => self.lock(step),
            "sem" => self.sem(step),
            "unlock" => self.unlock(step),
            "wait_lost" => self.wait_lost(step),
            "wait_at_risk" => self.wait_risk(step, true),
            "wait_safe" => self.wait_risk(step, false),
            "await" => self.await_op(step),
            "cancel" => {
                let name = field(step, "op");
                let bg = self
                    .background
                    .get(name)
                    .ok_or_else(|| format!("no background op {:?}", name))?;
                done(bg.canceller.cancel().map(|_| Json::Null))
            }
            "cached" => self.cached(step),
            "rate" => self.rate(step),
            "warm" => self.warm(step),
            "unlock_id" => self.unlock_id(step),
            "invalidate" => done(self.client(step)?.invalidate(keys_of(step))),
            "update" => {
                let f = step
                    .get("writer")
                    .map_or("", |w| field(w, "count_file"))
                    .to_string();
                done(
                    self.client(step)?
                        .update(keys_of(step), || append_line(&f))
                        .map(|_| Json::Null),
                )
            }
            // The client opens a new connection by itself at its next call.
            "reconnect" => self.client(step).map(|_| Json::object()),
            "count" => Ok(Json::object().set("lines", count_lines(field(step, "file")))),
            "pause" => {
                thread::sleep(Duration::from_secs(60));
                Ok(Json::object())
            }
            other => Err(format!("unknown step {:?}", other)),
        }
    }

    /// A "$NAME.FIELD" reference resolved, or the literal itself.
    fn value(&self, v: &Json) -> Result<Json, String> {
        let s = match v.as_str() {
            Some(s) if s.starts_with('$') => &s[1..],
            _ => return Ok(v.clone()),
        };
        let (name, f) = s
            .split_once('.')
            .ok_or_else(|| format!("bad reference {:?}", s))?;
        let saved = self
            .saved
            .get(name)
            .ok_or_else(|| format!("nothing saved as {:?}", name))?;
        Ok(saved.get(f).cloned().unwrap_or(Json::Null))
    }

    fn check(&self, res: &Json, expect: &Json) -> Result<(), String> {
        let want_err = expect.get("error");
        if let Some(code) = res.get("error") {
            return match want_err {
                Some(w) if w == code => Ok(()),
                Some(w) => Err(format!("expected error {}, got error {}", w, code)),
                None => Err(format!("error {}", code)),
            };
        }
        if let Some(w) = want_err {
            return Err(format!("expected error {}, got {}", w, res));
        }
        if let Json::Object(m) = expect {
            for (name, matcher) in m {
                let got = res.get(name).cloned().unwrap_or(Json::Null);
                self.matches(name, &got, matcher)?;
            }
        }
        Ok(())
    }

    fn matches(&self, name: &str, got: &Json, matcher: &Json) -> Result<(), String> {
        if let Json::Object(m) = matcher {
            for (op, v) in m {
                let want = self.value(v)?;
                if !compare(op, got, &want) {
                    return Err(format!("expected {} {} {}, got {}", name, op, want, got));
                }
            }
            return Ok(());
        }
        let want = self.value(matcher)?;
        if same(got, &want) {
            Ok(())
        } else {
            Err(format!("expected {} {}, got {}", name, want, got))
        }
    }

    /// Carry out STEPS; the failure names the step by index and `do`.
    fn steps(&mut self, steps: &[Json]) -> Result<(), String> {
        for (i, step) in steps.iter().enumerate() {
            let started = Instant::now();
            let what = |m: String| format!("step {} ({}): {}", i + 1, field(step, "do"), m);
            let mut res = self.step(step).map_err(what)?;
            if res.get("elapsed_ms").is_none() {
                res = res.set("elapsed_ms", started.elapsed().as_millis() as i64);
            }
            self.check(&res, step.get("expect").unwrap_or(&Json::object()))
                .map_err(what)?;
            if let Some(name) = step.get("as").and_then(Json::as_str) {
                self.saved.insert(name.to_string(), res);
            }
        }
        Ok(())
    }

    /// Close every client the scenario opened (holds first, so their
    /// unlocks go out while their session lives).
    fn close(&mut self) {
        self.held.clear();
        for (_, bg) in self.background.drain() {
            let _ = bg.canceller.cancel();
            let _ = bg.thread.join();
        }
        for (_, c) in self.clients.drain() {
            c.close();
        }
    }
}

fn same(a: &Json, b: &Json) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn compare(op: &str, got: &Json, want: &Json) -> bool {
    if op == "ne" {
        return !same(got, want);
    }
    let (x, y) = match (got.as_f64(), want.as_f64()) {
        (Some(x), Some(y)) => (x, y),
        _ => return false,
    };
    match op {
        "gt" => x > y,
        "ge" => x >= y,
        "lt" => x < y,
        "le" => x <= y,
        _ => false,
    }
}

fn scenario(path: &str) -> Result<(String, Vec<Json>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {}", path, e))?;
    let s = Json::parse(&text).map_err(|e| format!("{}: {}", path, e))?;
    let steps = s
        .get("steps")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    Ok((field(&s, "name").to_string(), steps))
}

fn run_file(path: &str) -> bool {
    let (name, steps) = match scenario(path) {
        Ok(s) => s,
        Err(e) => {
            println!("not ok {}: {}", path, e);
            return false;
        }
    };
    let begin = Json::object()
        .set("do", "env")
        .set("action", "begin")
        .set("scenario", name.as_str());
    let mut run = Run::default();
    let r = control(&begin)
        .map_err(|e| format!("begin: {}", e))
        .and_then(|_| run.steps(&steps));
    run.close();
    match &r {
        Ok(()) => println!("ok {}", name),
        Err(e) => println!("not ok {}: {}", name, e),
    }
    r.is_ok()
}

fn helper(json: &str) -> i32 {
    let steps = match Json::parse(json) {
        Ok(Json::Array(a)) => a,
        _ => {
            eprintln!("--steps: not a JSON list of steps");
            return 1;
        }
    };
    let mut run = Run::default();
    let r = run.steps(&steps);
    run.close();
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("helper: {}", e);
            1
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() == 2 && args[0] == "--steps" {
        std::process::exit(helper(&args[1]));
    }
    let (mut passed, mut failed) = (0, 0);
    for path in &args {
        if run_file(path) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("{} passed, {} failed", passed, failed);
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
