package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Client is the part of a go-redis client a RedisHash uses: *redis.Client,
// *redis.ClusterClient and *redis.Ring all satisfy it.
type Client interface {
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	HSet(ctx context.Context, key string, values ...any) *redis.IntCmd
	HDel(ctx context.Context, key string, fields ...string) *redis.IntCmd
}

// FieldError is a field of the hash whose value is not a quota. Its key
// keeps the last good quota this RedisHash read for it (Kept), or, for a
// key never seen valid, gets the limiter's own limit, until the value is
// fixed.
type FieldError struct {
	Hash, Field, Value string
	Kept               throttle.Quota // the quota kept in force; zero: the limiter's own limit
	Err                error          // wraps throttle.ErrInvalidOption
}

func (e *FieldError) Error() string {
	kept := "the limiter's own limit"
	if !e.Kept.IsZero() {
		kept = fmt.Sprintf("the last good quota %q", e.Kept.String())
	}
	return fmt.Sprintf("quota: hash %q, field %q: value %q: %v (keeping %s)", e.Hash, e.Field, e.Value, e.Err, kept)
}

// LostError reports that the hash, once read with fields, now reads empty
// (FLUSHALL, a restart without its data, a failover to a replica that
// lacks it): a lost hash is not an empty one, so every quota last read
// stays in force until the hash is written again.
type LostError struct {
	Hash string
	Kept int // quotas kept in force
}

func (e *LostError) Error() string {
	return fmt.Sprintf("quota: hash %q is gone (flushed, or Redis lost its data): keeping the %d quotas last read until it is written again", e.Hash, e.Kept)
}

// Marker is the field that Set and Delete keep in the hash, so that a
// hash emptied on purpose (every quota deleted) is told from a lost one.
// It is not a quota and is never read as one.
const Marker = "(queuethrottle quotas)"

func (e *FieldError) Unwrap() error { return e.Err }

// failReportEvery bounds how often a failing read is reported.
const failReportEvery = 5 * time.Second

// RedisHash is a set of per-key quotas kept in one Redis hash: field = the
// limiter key (a tenant, an API key), value = the quota as
// throttle.ParseQuota reads it ("20/1s", "20/1s burst 40"). Change it with
// Set, or from anywhere with one command:
//
//	redis-cli HSET throttle:quotas tenant-42 "100/1s burst 200"
//	redis-cli HDEL throttle:quotas tenant-42
//
// Every process holds the whole hash in memory and reads it again every
// WithRefresh (default 250 ms, one HGETALL), so a change is seen by every
// process within that plus one read, and Func's QuotaFunc answers from
// memory: a decision costs no extra round trip. A key without a field
// gets the zero Quota, that is the limiter's own limit.
//
// A value of 0 ("0/1s") blocks the key: its quota is throttle.Blocked with
// the refresh interval as RetryAfter, so every decision of the key is a
// rejection (nothing charged, no failure policy) and a message comes back
// about when an unblocking edit can have been read.
//
// Nothing Redis loses or a typo writes lifts a limit. While Redis cannot
// be read, the last quotas read stay in force. A field whose value is not
// a quota keeps its key's last good quota (the limiter's own limit for a
// key never seen valid), reported as a *FieldError naming the field and
// value, once per bad value. A hash that reads empty after it was read
// with fields is taken as lost, not emptied: every quota last read stays
// until the hash is written again (a Set or Delete of this RedisHash
// writes them all back), reported once as a *LostError. To
// empty it on purpose, Delete its fields (Delete and Set keep the Marker
// field in it), or leave any field of your own in it. Failures go to
// WithErrorHandler and WithLogger.
//
// A RedisHash is safe for concurrent use. Close stops its refresh; the
// zero RedisHash is not usable, call NewRedisHash.
type RedisHash struct {
	client Client
	key    string
	cfg    config

	quotas atomic.Pointer[map[string]throttle.Quota]

	mu       sync.Mutex        // guards the fields below (the refresh state)
	raw      map[string]string // the hash as last read
	bad      map[string]string // fields reported bad, with their value
	lost     bool              // the hash read empty after it had fields (reported)
	failedAt time.Time         // last failed read reported

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewRedisHash reads the quotas in the hash key of c, once before it
// returns (bounded by ctx and WithTimeout), then again every WithRefresh
// in the background until Close. A hash that does not exist is empty.
//
// Errors: one wrapping throttle.ErrInvalidOption naming the field for a
// nil client, an empty key or a bad option; otherwise the first read's,
// wrapped as "quota: redis: ...". Bad values are not errors here: they are
// skipped and reported (see RedisHash).
func NewRedisHash(ctx context.Context, c Client, key string, opts ...Option) (*RedisHash, error) {
	if rediskey.NilClient(c) {
		return nil, &throttle.OptionError{Field: "client", Reason: "must not be nil"}
	}
	if key == "" {
		return nil, &throttle.OptionError{Field: "key", Reason: "must not be empty"}
	}
	cfg := config{refresh: DefaultRefresh, timeout: defaultTimeout}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	h := &RedisHash{client: c, key: key, cfg: cfg, bad: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	empty := map[string]throttle.Quota{}
	h.quotas.Store(&empty)
	if err := h.Refresh(ctx); err != nil {
		return nil, err
	}
	go h.loop()
	return h, nil
}

// Func returns the QuotaFunc to give a limiter (window.WithQuotas,
// bucket.WithQuotas): the key's quota as last read, or the zero Quota. It
// reads memory only.
func (h *RedisHash) Func() throttle.QuotaFunc { return h.Quota }

// Quota returns key's quota as last read, or the zero Quota (the
// limiter's own limit) for a key without a valid field.
func (h *RedisHash) Quota(key string) throttle.Quota { return (*h.quotas.Load())[key] }

// Quotas returns a copy of every quota as last read.
func (h *RedisHash) Quotas() map[string]throttle.Quota { return maps.Clone(*h.quotas.Load()) }

// Set stores key's quota in the hash (HSET, with the Marker field), for
// every process, and in this process at once. The zero Quota deletes the
// field, as Delete; throttle.Blocked blocks the key (stored as "0/PER").
// Errors: one wrapping throttle.ErrInvalidOption for a quota that is not
// valid (throttle.Quota.Validate) or for the key Marker, before any Redis
// call; otherwise a Redis or context error, wrapped as "quota: redis: ...".
func (h *RedisHash) Set(ctx context.Context, key string, q throttle.Quota) error {
	if q.IsZero() {
		return h.Delete(ctx, key)
	}
	if err := q.Validate(); err != nil {
		return err
	}
	if key == Marker {
		return &throttle.OptionError{Field: "key", Reason: fmt.Sprintf("%q is the hash's marker field", Marker)}
	}
	v := q.String()
	if err := h.client.HSet(ctx, h.key, h.restoring(key, key, v, Marker, "1")...).Err(); err != nil {
		return fmt.Errorf("quota: redis: %w", err)
	}
	h.apply(func(raw map[string]string) { raw[key] = v })
	return nil
}

// Delete removes key's field (HDEL, after writing the Marker field, so
// that the hash stays and reads emptied, not lost): the key gets the
// limiter's own limit, in every process, and in this one at once. Deleting
// a missing field is not an error. Errors are Redis or context errors,
// wrapped as "quota: redis: ...".
func (h *RedisHash) Delete(ctx context.Context, key string) error {
	if key == Marker {
		return &throttle.OptionError{Field: "key", Reason: fmt.Sprintf("%q is the hash's marker field", Marker)}
	}
	if err := h.client.HSet(ctx, h.key, h.restoring(key, Marker, "1")...).Err(); err != nil {
		return fmt.Errorf("quota: redis: %w", err)
	}
	if err := h.client.HDel(ctx, h.key, key).Err(); err != nil {
		return fmt.Errorf("quota: redis: %w", err)
	}
	h.apply(func(raw map[string]string) { delete(raw, key) })
	return nil
}

// restoring returns values (HSET's field-value pairs), and while the hash
// is lost the fields last read but key's too: the first write after a
// loss puts back every quota kept in force, so that one Set does not drop
// the others.
func (h *RedisHash) restoring(key string, values ...any) []any {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.lost {
		return values
	}
	for f, v := range h.raw {
		if f != key && f != Marker {
			values = append(values, f, v)
		}
	}
	return values
}

// Refresh reads the hash now (HGETALL, bounded by ctx and WithTimeout) and
// puts what it read in force. The background refresh calls it every
// WithRefresh; call it to see a change at once. On an error the quotas in
// force stay; the error is returned, wrapped as "quota: redis: ...", and
// not reported to the handler.
func (h *RedisHash) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.timeout)
	defer cancel()
	raw, err := h.client.HGetAll(ctx, h.key).Result()
	if err != nil {
		return fmt.Errorf("quota: redis: HGETALL %s: %w", h.key, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(raw) == 0 && len(h.raw) > 0 {
		if !h.lost {
			h.lost = true
			h.report(&LostError{Hash: h.key, Kept: len(*h.quotas.Load())})
		}
		return nil
	}
	h.lost = false
	if !maps.Equal(raw, h.raw) {
		h.install(raw)
	}
	return nil
}

// apply changes the hash as last read with f, and puts it in force.
func (h *RedisHash) apply(f func(raw map[string]string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	raw := maps.Clone(h.raw)
	if raw == nil {
		raw = map[string]string{}
	}
	f(raw)
	h.install(raw)
}

// install parses raw and puts it in force, reporting each bad value once.
// A bad value keeps its key's quota in force. The caller holds h.mu.
func (h *RedisHash) install(raw map[string]string) {
	old := *h.quotas.Load()
	quotas := make(map[string]throttle.Quota, len(raw))
	for field, v := range raw {
		if field == Marker {
			continue
		}
		q, err := throttle.ParseQuota(v)
		if err != nil {
			kept, ok := old[field]
			if ok {
				quotas[field] = kept
			}
			if h.bad[field] != v {
				h.bad[field] = v
				h.report(&FieldError{Hash: h.key, Field: field, Value: v, Kept: kept, Err: err})
			}
			continue
		}
		if q.IsBlocked() {
			q = throttle.Blocked(h.cfg.refresh)
		}
		delete(h.bad, field)
		quotas[field] = q
	}
	for field := range h.bad {
		if _, ok := raw[field]; !ok {
			delete(h.bad, field)
		}
	}
	h.raw = raw
	h.quotas.Store(&quotas)
}

// loop refreshes every WithRefresh until Close.
func (h *RedisHash) loop() {
	defer close(h.done)
	t := time.NewTicker(h.cfg.refresh)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		err := h.Refresh(ctx)
		if errors.Is(err, context.Canceled) {
			continue
		}
		h.mu.Lock()
		if err == nil {
			h.failedAt = time.Time{} // the next outage is reported at once
			h.mu.Unlock()
			continue
		}
		if time.Since(h.failedAt) >= failReportEvery {
			h.failedAt = time.Now()
			h.report(fmt.Errorf("%w (keeping the %d quotas last read)", err, len(*h.quotas.Load())))
		}
		h.mu.Unlock()
	}
}

// report hands err to the handler and the logger. The caller holds h.mu.
func (h *RedisHash) report(err error) {
	if h.cfg.onError != nil {
		h.cfg.onError(err)
	}
	if h.cfg.logger != nil {
		h.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn, "quota: refresh", slog.String("hash", h.key), slog.Any("error", err))
	}
}

// Close stops the background refresh and waits for it; the quotas last
// read stay in force for Func. It is safe to call more than once, and
// always returns nil.
func (h *RedisHash) Close() error {
	h.once.Do(func() { close(h.stop) })
	<-h.done
	return nil
}
