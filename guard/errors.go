package guard

import "github.com/cacheguard/cacheguard/internal/aside"

var (
	// ErrNotFound: the ID does not exist in the source of truth (the bloom
	// filter has never seen it, an empty marker is cached, or load said so).
	// A loader reports absence by returning an error that wraps ErrNotFound.
	ErrNotFound = aside.ErrNotFound
	// ErrInvalidKey: the ID is empty, longer than MaxKeyLen or holds
	// control bytes. No Redis command was sent.
	ErrInvalidKey = aside.ErrInvalidKey
	// ErrLoaderPanic is wrapped by the error callers get when load panicked
	// (the panic value and stack follow in the message).
	ErrLoaderPanic = aside.ErrLoaderPanic
	// ErrInvalidOptions: New was given a bad name or option.
	ErrInvalidOptions = aside.ErrInvalidOptions
	// ErrBusy: another process was loading the ID for longer than LockWait.
	ErrBusy = aside.ErrBusy
	// ErrWrongType: the Guard is bound to another value type (by its first
	// Get or For): one Guard serves one type.
	ErrWrongType = aside.ErrWrongType
	// ErrClosed: the Guard was closed.
	ErrClosed = aside.ErrClosed
	// ErrUnavailable is wrapped (with the Redis error) by every error that
	// Redis failing to answer causes, from every function of every package
	// of cacheguard (bloom.ErrUnavailable and lock.ErrUnavailable are the
	// same value): a dial or I/O error, a timeout, an error reply such as
	// OOM under maxmemory or NOPERM from an ACL. Retry later, or serve from
	// the source of truth. It is never ErrNotFound.
	ErrUnavailable = aside.ErrUnavailable
	// ErrUnconfirmed: Redis cannot answer, or its bloom filter is not ready,
	// and this process's copy of the filter has never seen the ID. Another
	// process may have created it since the copy, so it is neither loaded
	// nor answered ErrNotFound. It wraps ErrUnavailable: retry later (503).
	// FilterOptions.NoLocalCopy turns it off.
	ErrUnconfirmed = aside.ErrUnconfirmed
)
