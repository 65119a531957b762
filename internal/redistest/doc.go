// Package redistest runs a real redis-server for tests: a private process on
// a free loopback port that a test can stop, restart on the same port, pause
// and resume to inject faults.
//
// [Start] gives a test its own server, stopped at the test's cleanup.
// [Shared] gives every test of a binary one server, started on first use;
// call [Main] from TestMain so it is stopped when the tests end (on Linux
// the server is also killed when the test process dies, through
// Pdeathsig). Tests on the shared server must use keys of their own and must
// not call Stop, Restart or Pause on it.
//
// [StartCluster] gives a test a Redis Cluster of three masters (three
// servers in cluster mode joined with redis-cli --cluster create), whose
// nodes it can stop and restart one by one.
//
// The server runs with no persistence (--save "" --appendonly no) in a
// temporary directory. The redis-server binary is looked up as
// $REDIS_SERVER, then on $PATH (redis-cli, for a cluster, as $REDIS_CLI,
// then on $PATH); when it is missing, tests are skipped
// with a message saying to install it, or fail when the environment
// variable CI is "true".
package redistest
