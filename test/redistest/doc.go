// Package redistest runs a real redis-server for tests: on a free loopback port, without
// persistence, in the test's temporary folder, killed when the test ends.
//
// Stop, Restart, Pause and Resume simulate the Redis trouble a replica must survive: a server that
// is gone (connections refused) and one that hangs (accepts nothing, answers nothing).
//
// redis-server comes from Debian's redis-server package (test/setup.sh installs it) or is named by
// $SANDGATE_REDIS_SERVER. When it is missing the test is skipped, unless $SANDGATE_REQUIRE_TOOLS is
// set (CI), where it fails.
package redistest
