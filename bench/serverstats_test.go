package main

import "testing"

func TestParseCountersSplitsTheKernelsCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.500000\r\n" +
		"used_cpu_sys_children:9.000000\r\nused_cpu_user_main_thread:0.400000\r\n\r\n" +
		"# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_fcall:calls=4,usec=30,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_subscribe:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n"
	c := parseCounters(info)
	if c.calls != 16 || c.subs != 2 || c.lua != 80 || c.cpu != 1.75 || c.sys != 1.25 || c.nodes != 1 {
		t.Fatalf("parseCounters = %+v; want 16 calls, 2 subs, 80 µs of scripts, cpu 1.75 s, sys 1.25 s, 1 node", c)
	}
	before := counters{calls: 2, lua: 20, cpu: 0.25, sys: 0.5, nodes: 1}
	if d := c.since(before, 3); d.calls != 10 || d.lua != 60 || d.cpu != 1.5 || d.sys != 0.75 {
		t.Fatalf("since = %+v; want 10 calls (4 INFO out), 60 µs of scripts, cpu 1.5 s, sys 0.75 s", d)
	}
	if s := c.add(before); s.sys != 1.75 || s.nodes != 2 {
		t.Fatalf("add = %+v; want sys 1.75 s over 2 nodes", s)
	}
}
