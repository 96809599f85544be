package main

import (
	"strings"
	"testing"
)

func TestTargetOptions(t *testing.T) {
	t.Setenv(envPassword, "")
	t.Setenv("REDIS_PASSWORD", "")
	cases := []struct {
		spec     string
		addr     string
		user, pw string
		db       int
		tls      string // the TLS server name, "-" for no TLS
	}{
		{"", defaultAddr, "", "", 0, "-"},
		{"10.0.0.5:6380", "10.0.0.5:6380", "", "", 0, "-"},
		{"redis.example.com", "redis.example.com:6379", "", "", 0, "-"},
		{"redis://:pw@10.0.0.5:6380/2", "10.0.0.5:6380", "", "pw", 2, "-"},
		{"rediss://alice:pw@redis.example.com:6380", "redis.example.com:6380", "alice", "pw", 0, "redis.example.com"},
		{"rediss://alice@redis.example.com:6380/3?dial_timeout=2s", "redis.example.com:6380", "alice", "", 3, "redis.example.com"},
	}
	for _, c := range cases {
		p, err := target{c.spec, "--redis"}.plan()
		if err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		o := p.single
		if o == nil {
			t.Errorf("%q: %v, want one server", c.spec, p)
			continue
		}
		tls := "-"
		if o.TLSConfig != nil {
			tls = o.TLSConfig.ServerName
		}
		if o.Addr != c.addr || o.Username != c.user || o.Password != c.pw || o.DB != c.db || tls != c.tls {
			t.Errorf("%q: addr %s user %q password %q db %d TLS %q", c.spec, o.Addr, o.Username, o.Password, o.DB, tls)
		}
	}
	for _, spec := range []string{"redis://:secret@host:port", "host:0", "host:99999", "http://host:1", "a@b:1",
		"redis://:secret@a:1,b:x", "redis+sentinel://:secret@a:1", "redis://:secret@a:1,b:2/1", "a:1,,b:2"} {
		_, err := target{spec, "$REDIS_URL"}.plan()
		if err == nil || strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "$REDIS_URL") {
			t.Errorf("%q: error %v; want one that names the source and hides the password", spec, err)
		}
	}
}

func TestTargetClusterAndSentinel(t *testing.T) {
	t.Setenv(envPassword, "")
	t.Setenv("REDIS_PASSWORD", "")
	p, err := target{"10.0.0.1:7000,10.0.0.2,[::1]:7002", "--redis"}.plan()
	if err != nil || p.cluster == nil || strings.Join(p.cluster.Addrs, " ") != "10.0.0.1:7000 10.0.0.2:6379 [::1]:7002" {
		t.Errorf("address list: %v, %v; want a cluster of the three", p, err)
	}
	p, err = target{"rediss://bob@a.example.com:7000,b.example.com:7001?read_timeout=2s", "--redis"}.plan()
	if err != nil || p.cluster == nil || len(p.cluster.Addrs) != 2 || p.cluster.Username != "bob" ||
		p.cluster.TLSConfig == nil || p.cluster.TLSConfig.ServerName != "a.example.com" || p.cluster.ReadTimeout.Seconds() != 2 {
		t.Errorf("cluster URL: %+v, %v", p.cluster, err)
	}
	p, err = target{"rediss+sentinel://s1:26379,s2:26380/mymaster/3", "--redis"}.plan()
	if err != nil || p.failover == nil {
		t.Fatalf("sentinel URL: %v, %v", p, err)
	}
	f := p.failover
	if f.MasterName != "mymaster" || strings.Join(f.SentinelAddrs, " ") != "s1:26379 s2:26380" || f.DB != 3 || f.TLSConfig == nil {
		t.Errorf("sentinel URL: %+v", f)
	}
	if s := p.String(); s != `master "mymaster" of sentinels s1:26379,s2:26380 (TLS)` {
		t.Errorf("described as %q", s)
	}
}

func TestTargetPasswordFromEnvironment(t *testing.T) {
	t.Setenv("REDIS_PASSWORD", "fallback")
	t.Setenv(envPassword, "")
	t.Setenv(envSentinelPassword, "spw")
	if p, err := (target{"127.0.0.1:6379", "--redis"}).plan(); err != nil || p.single.Password != "fallback" {
		t.Errorf("$REDIS_PASSWORD: %+v, %v", p.single, err)
	}
	t.Setenv(envPassword, "pw")
	if p, err := (target{"a:1,b:2", "--redis"}).plan(); err != nil || p.cluster.Password != "pw" {
		t.Errorf("$%s: %+v, %v", envPassword, p.cluster, err)
	}
	if p, err := (target{"redis+sentinel://s:26379/m", "--redis"}).plan(); err != nil || p.failover.Password != "pw" || p.failover.SentinelPassword != "spw" {
		t.Errorf("sentinel: %+v, %v", p.failover, err)
	}
	if p, err := (target{"redis://:inurl@h:1", "--redis"}).plan(); err != nil || p.single.Password != "inurl" {
		t.Errorf("the URL's password comes first: %+v, %v", p.single, err)
	}
}
