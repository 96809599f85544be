package main

import (
	"strings"
	"testing"
)

func TestTargetOptions(t *testing.T) {
	cases := []struct {
		spec     string
		addr     string
		user, pw string
		db       int
		tls      bool
	}{
		{"", defaultAddr, "", "", 0, false},
		{"10.0.0.5:6380", "10.0.0.5:6380", "", "", 0, false},
		{"redis.example.com", "redis.example.com:6379", "", "", 0, false},
		{"redis://:pw@10.0.0.5:6380/2", "10.0.0.5:6380", "", "pw", 2, false},
		{"rediss://alice:pw@redis.example.com:6380", "redis.example.com:6380", "alice", "pw", 0, true},
	}
	for _, c := range cases {
		o, err := target{c.spec, "--redis"}.options()
		if err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		if o.Addr != c.addr || o.Username != c.user || o.Password != c.pw || o.DB != c.db || (o.TLSConfig != nil) != c.tls {
			t.Errorf("%q: addr %s user %q password %q db %d TLS %v", c.spec, o.Addr, o.Username, o.Password, o.DB, o.TLSConfig != nil)
		}
	}
	for _, spec := range []string{"redis://:secret@host:port", "host:0", "host:99999", "http://host:1", "a@b:1"} {
		_, err := target{spec, "$REDIS_URL"}.options()
		if err == nil || strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "$REDIS_URL") {
			t.Errorf("%q: error %v; want one that names the source and hides the password", spec, err)
		}
	}
}
