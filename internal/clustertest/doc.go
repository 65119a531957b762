// Package clustertest holds only tests: every Redis-backed limiter family
// (window.Redis, bucket.Redis, bucket.Hybrid) run against a real
// three-master Redis Cluster started by internal/redistest, through a
// *redis.ClusterClient. It checks that identities of every spelling spread
// over the masters without a CROSSSLOT error and are limited exactly as on
// a single server, and that a dead master degrades its own identities
// (under the failure policy) and no others. It also counts the script
// calls of a flush (one per hash slot; one per key with
// WithOneKeyPerCall; a cluster node behind a plain client refuses keys of
// several slots once, then takes one call per slot), and runs the rolling
// upgrade of multi-key calls: processes with and without
// WithOneKeyPerCall on the same identities, on a standalone server and on
// the cluster, admit exactly the limit together.
package clustertest
