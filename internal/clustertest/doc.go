// Package clustertest holds only tests: every Redis-backed limiter family
// (window.Redis, bucket.Redis, bucket.Hybrid) run against a real
// three-master Redis Cluster started by internal/redistest, through a
// *redis.ClusterClient. It checks that identities of every spelling spread
// over the masters without a CROSSSLOT error and are limited exactly as on
// a single server, and that a dead master degrades its own identities
// (under the failure policy) and no others.
package clustertest
