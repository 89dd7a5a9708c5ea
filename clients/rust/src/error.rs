//! The one error type of the client.

use crate::json::Json;
use std::fmt;

type Source = Box<dyn std::error::Error + Send + Sync>;

/// Every error of the client: `code` is the protocol's error code for an
/// error reply (`not_held`, `busy`, `unauthorized`, ...) or the client's
/// own: `connect` (the daemon could not be reached; the message names the
/// socket and what to check), `io` (the connection failed: its session
/// and the session's locks are gone), `timeout`, `invalid` (a bad
/// argument), `bad_value` (a cached value that cannot be read),
/// `not_acquired`, `no_permit` and `loader` (the loader of `cached()` or
/// the writer of `update()` failed; its error is the `source()`).
#[derive(Debug)]
pub struct Error {
    code: String,
    message: String,
    reply: Option<Json>,
    source: Option<Source>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> Error {
        Error {
            code: code.to_string(),
            message: message.into(),
            reply: None,
            source: None,
        }
    }

    pub(crate) fn with_source(mut self, source: Source) -> Error {
        self.source = Some(source);
        self
    }

    /// The error of an `"ok":false` reply.
    pub(crate) fn from_reply(reply: Json) -> Error {
        let e = reply.get("error");
        let code = e.map_or("internal", |e| e.str_of("code"));
        let message = e.map_or("", |e| e.str_of("message"));
        let mut err = Error::new(if code.is_empty() { "internal" } else { code }, message);
        err.reply = Some(reply);
        err
    }

    /// The protocol's error code, or one of the client's own.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// For people.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The whole reply of an error reply (with `reason`, `outcome`, `key`
    /// inside its `error` object where the daemon gives them).
    pub fn reply(&self) -> Option<&Json> {
        self.reply.as_ref()
    }

    /// True when the request left for Redis and no answer came
    /// (`redis_unavailable` with `"outcome":"unknown"`): it may have taken
    /// effect. An unlock with a request id is then safe to repeat.
    pub fn outcome_unknown(&self) -> bool {
        self.reply
            .as_ref()
            .and_then(|r| r.get("error"))
            .and_then(|e| e.get("outcome"))
            .and_then(Json::as_str)
            == Some("unknown")
    }

    /// The `reason` of a `not_held` error: `absent` or `other`.
    pub fn reason(&self) -> Option<&str> {
        self.reply.as_ref()?.get("error")?.get("reason")?.as_str()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "leased: {}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.source {
            Some(s) => Some(s.as_ref()),
            None => None,
        }
    }
}
