package main

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// subscriptionCommands are counted from the server: clients send them on
// pub/sub connections, which go-redis hooks do not see, and scripts cannot
// run them.
var subscriptionCommands = map[string]bool{
	"cmdstat_subscribe": true, "cmdstat_unsubscribe": true,
	"cmdstat_psubscribe": true, "cmdstat_punsubscribe": true,
	"cmdstat_ssubscribe": true, "cmdstat_sunsubscribe": true,
}

// scriptCommands run Lua: their usec is the scripts' run time.
var scriptCommands = map[string]bool{"cmdstat_fcall": true, "cmdstat_evalsha": true, "cmdstat_eval": true}

// counters are the server's cumulative figures at one instant.
type counters struct {
	calls int64   // INFO commandstats calls, summed over all commands
	subs  int64   // the calls of subscriptionCommands
	lua   float64 // the usec of scriptCommands: the scripts' run time, in µs
	cpu   float64 // INFO cpu used_cpu_user + used_cpu_sys, in seconds
	sys   float64 // INFO cpu used_cpu_sys: the kernel's share of cpu
	nodes int     // servers summed, each read by one INFO per snapshot
}

// add returns the sum of c and o, as one snapshot of both servers.
func (c counters) add(o counters) counters {
	return counters{calls: c.calls + o.calls, subs: c.subs + o.subs, lua: c.lua + o.lua, cpu: c.cpu + o.cpu, sys: c.sys + o.sys, nodes: c.nodes + o.nodes}
}

// snapshot reads the counters with one INFO commandstats cpu.
func (s *server) snapshot(ctx context.Context) (counters, error) {
	info, err := s.admin.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return counters{}, err
	}
	return parseCounters(info), nil
}

// parseCounters reads one server's counters from its INFO commandstats cpu.
func parseCounters(info string) counters {
	c := counters{nodes: 1}
	for key, value := range infoFields(info) {
		switch {
		case strings.HasPrefix(key, "cmdstat_"):
			n := commandCalls(value)
			c.calls += n
			if subscriptionCommands[key] {
				c.subs += n
			}
			if scriptCommands[key] {
				c.lua += commandField(value, "usec")
			}
		case key == "used_cpu_user" || key == "used_cpu_sys":
			v, _ := strconv.ParseFloat(value, 64)
			c.cpu += v
			if key == "used_cpu_sys" {
				c.sys += v
			}
		}
	}
	return c
}

// since returns how much the counters grew from before to c, net of the
// benchmark's own commands: Redis counts a command after running it, so
// the growth holds, on every server summed, the first snapshot's INFO and
// the samples' INFO clients sent between the snapshots, but not the second
// snapshot's INFO.
func (c counters) since(before counters, samples int) counters {
	return counters{
		nodes: c.nodes,
		calls: c.calls - before.calls - int64(c.nodes)*(1+int64(samples)),
		subs:  c.subs - before.subs,
		lua:   c.lua - before.lua,
		cpu:   c.cpu - before.cpu,
		sys:   c.sys - before.sys,
	}
}

// clients returns INFO clients connected_clients, the benchmark's own
// connection included.
func (s *server) clients(ctx context.Context) (int, error) {
	info, err := s.admin.Info(ctx, "clients").Result()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(infoFields(info)["connected_clients"])
}

// infoFields parses an INFO reply into its "key:value" fields.
func infoFields(info string) map[string]string {
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(key, "#") {
			fields[key] = value
		}
	}
	return fields
}

// commandCalls reads calls=N from a commandstats value.
func commandCalls(value string) int64 {
	return int64(commandField(value, "calls"))
}

// commandField reads the figure name of one INFO commandstats value.
func commandField(value, name string) float64 {
	for _, part := range strings.Split(value, ",") {
		if n, ok := strings.CutPrefix(part, name+"="); ok {
			v, _ := strconv.ParseFloat(n, 64)
			return v
		}
	}
	return 0
}

// leftovers looks for the keys of a run, the names of whose locks begin
// with name: how many have a TTL, and which have none (nothing a lock
// library writes may stay for good).
func (s *server) leftovers(ctx context.Context, name string) (withTTL int64, persistent []string, err error) {
	var cursor uint64
	for {
		var keys []string
		keys, cursor, err = s.admin.Scan(ctx, cursor, "*"+name+"*", 1000).Result()
		if err != nil {
			return 0, nil, err
		}
		keys = slices.DeleteFunc(keys, func(k string) bool { return !ofLock(k, name) })
		pipe := s.admin.Pipeline()
		ttls := make([]*redis.DurationCmd, len(keys))
		for i, k := range keys {
			ttls[i] = pipe.PTTL(ctx, k)
		}
		if len(keys) > 0 {
			if _, err := pipe.Exec(ctx); err != nil {
				return 0, nil, err
			}
		}
		for i, ttl := range ttls {
			switch ttl.Val() {
			case -1: // no TTL
				persistent = append(persistent, keys[i])
			case -2: // gone since the scan
			default:
				withTTL++
			}
		}
		if cursor == 0 {
			return withTTL, persistent, nil
		}
	}
}

// ofLock reports whether key belongs to the lock called name, or to one
// called name:...: name is followed by the key's end, a ':' or the '}'
// that closes a hash tag (not by more of another name, as "redisync" is by
// "-fair").
func ofLock(key, name string) bool {
	i := strings.Index(key, name)
	if i < 0 {
		return false
	}
	rest := key[i+len(name):]
	return rest == "" || rest[0] == ':' || rest[0] == '}'
}
