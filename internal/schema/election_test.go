package schema

import "testing"

func TestElectionKeys(t *testing.T) {
	e, l := ElectionKeys("p", "a:b"), LockKeys("p", "a:b")
	keys := []string{e.Hash, e.Queue, e.Bargers, e.Channel, e.Tombstone("x/y-1"), e.Changes}
	seen := map[string]bool{l.Hash: true, l.Queue: true, l.Bargers: true, l.Channel: true}
	for _, k := range keys {
		if Slot(k) != Slot("{a:b}") {
			t.Errorf("%s is in slot %d, not the name's %d", k, Slot(k), Slot("{a:b}"))
		}
		if seen[k] {
			t.Errorf("%s named twice, or shared with the lock of the same name", k)
		}
		seen[k] = true
	}
	if e.Hash != "p:elect:{a:b}" || e.Changes != "p:elect:{a:b}:changes" {
		t.Errorf("layout changed: %q %q", e.Hash, e.Changes)
	}
	if l.Changes != "" {
		t.Errorf("a lock has an election's channel of changes: %q", l.Changes)
	}
}

func TestParseElectionChange(t *testing.T) {
	c, ok := ParseElectionChange("12:11:7:3000:host:8080")
	if !ok || c != (ElectionChange{Revision: 12, Previous: 11, Token: 7, Lease: 3000, Value: "host:8080"}) {
		t.Errorf("ParseElectionChange = %+v, %v", c, ok)
	}
	if c, ok := ParseElectionChange("13:12:0:0:"); !ok || c.Token != 0 || c.Value != "" {
		t.Errorf("no leader: %+v, %v", c, ok)
	}
	for _, bad := range []string{"", "1:2:3", "1:2:3:x:v", "a:2:3:4:v"} {
		if _, ok := ParseElectionChange(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
