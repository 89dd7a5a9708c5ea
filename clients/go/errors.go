package leased

import (
	"context"
	"errors"
	"fmt"
)

// Error is every error the client returns: Code is the protocol's code
// for an error reply (not_held, busy, redis_unavailable, ...) or one of
// the client's own: connect, io, timeout, cancelled, invalid, bad_value,
// not_acquired, no_permit, not_found.
type Error struct {
	Code    string
	Message string
	// Reason is the error object's reason (not_held: absent or other).
	Reason string
	// Key is the error object's key (unauthorized: the key outside the
	// namespace).
	Key string
	// Outcome is "unknown" when the request left for Redis and no answer
	// came (redis_unavailable): it may have taken effect. An unlock is
	// then safe to repeat with the same request id; see OutcomeUnknown.
	Outcome string
	// Err is the error behind this one (a socket error, ctx.Err()).
	Err error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "leased: " + e.Code
	}
	return "leased: " + e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches by code, so errors.Is(err, leased.ErrNotHeld) works for
// any not_held error.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == ""
}

// Sentinels for errors.Is.
var (
	ErrConnect     = &Error{Code: "connect"}
	ErrIO          = &Error{Code: "io"}
	ErrTimeout     = &Error{Code: "timeout"}
	ErrCancelled   = &Error{Code: "cancelled"}
	ErrInvalid     = &Error{Code: "invalid"}
	ErrBadValue    = &Error{Code: "bad_value"}
	ErrNotAcquired = &Error{Code: "not_acquired"}
	ErrNoPermit    = &Error{Code: "no_permit"}
	// ErrNotFound is returned by a loader of Cached for "not found"
	// (cached as such), and by Cached for a key cached as not found.
	ErrNotFound = &Error{Code: "not_found"}
	ErrNotHeld  = &Error{Code: "not_held"}
)

// OutcomeUnknown reports whether err says the request may have taken
// effect although no answer came (the error's "outcome":"unknown").
func OutcomeUnknown(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Outcome == "unknown"
}

// Code gives the leased error code of err, or "" when err is not one.
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func newErr(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ctxErr turns a done context into a timeout or cancelled error that
// still matches context.DeadlineExceeded or context.Canceled.
func ctxErr(ctx context.Context, what string) error {
	err := ctx.Err()
	code := "cancelled"
	if errors.Is(err, context.DeadlineExceeded) {
		code = "timeout"
	}
	return &Error{Code: code, Message: what + ": " + err.Error(), Err: err}
}
