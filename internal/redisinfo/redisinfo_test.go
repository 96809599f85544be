package redisinfo

import "testing"

// TestParseInfo reads the server's name, version, mode and role as Redis
// and Valkey print them.
func TestParseInfo(t *testing.T) {
	for _, tc := range []struct{ info, want string }{
		{"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n# Replication\r\nrole:master\r\n",
			"redis 7.0.15 (standalone primary)"},
		{"redis_version:8.0.2\nredis_mode:cluster\nrole:slave\n", "redis 8.0.2 (cluster replica)"},
		{"redis_version:7.2.4\nserver_name:valkey\nvalkey_version:8.1.1\nserver_mode:standalone\nrole:master\n",
			"valkey 8.1.1 (standalone primary)"},
	} {
		if got := Parse(tc.info).String(); got != tc.want {
			t.Errorf("Parse(%q) = %q, want %q", tc.info, got, tc.want)
		}
	}
}
