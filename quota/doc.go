// Package quota provides sources of per-key quotas for the limiters'
// WithQuotas options (window.WithQuotas, bucket.WithQuotas): a
// throttle.QuotaFunc that a limiter calls on every decision.
//
// [RedisHash] keeps the quotas in one Redis hash, field = the limiter key
// (a tenant, an API key) and value = the quota as throttle.ParseQuota
// reads it:
//
//	redis-cli HSET throttle:quotas acme "50/1s burst 100" small-co 5/1s
//	redis-cli HSET throttle:quotas spammer 0/1s  # blocked: every request rejected
//	redis-cli HDEL throttle:quotas small-co      # back to the limiter's own limit
//
// Every process reads the whole hash every 250 ms (WithRefresh; one
// HGETALL) and answers the QuotaFunc from memory, so a change reaches
// every worker within about a quarter of a second and a decision costs no
// extra round trip.
//
// Nothing lifts a limit by accident: a bad value keeps the key's last
// good quota, a hash that vanishes (FLUSHALL) keeps every quota last read
// until it is written again, and while Redis cannot be read the last
// quotas stay in force; all three are reported through WithErrorHandler
// and WithLogger (see RedisHash).
//
// What a change does to a key's state is the limiter's rule: a window
// judges its log against the new limit (a smaller one never admits over
// it), a token bucket keeps the tokens it holds up to the new burst and
// refills at the new rate (see bucket.WithQuotas). Between the change and
// the moment a process reads it (at most one refresh), that process still
// decides on the old quota.
package quota
