package schema

import "testing"

func TestSlotMatchesRedisCluster(t *testing.T) {
	// Slots as CLUSTER KEYSLOT reports them.
	for key, want := range map[string]uint16{
		"123456789":            12739, // the CRC16/XMODEM check value 0x31C3 mod 16384
		"foo":                  12182,
		"{user1000}.following": 3443,
		"{user1000}.followers": 3443,
		"foo{}{bar}":           8363, // an empty tag: the whole key
		"foo{{bar}}zap":        4015, // the tag is "{bar"
		"redisync:lock:{a}:ch": 15495,
		"redisync:lock:{a}":    15495,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestKeysShareTheNameAsHashTag(t *testing.T) {
	l := LockKeys("p", "a:b")
	s := SemaphoreKeys("p", "a:b")
	keys := []string{l.Hash, l.Queue, l.Bargers, l.Channel, l.Tombstone("x/y-1"),
		s.Hash, s.Expiry, s.Queue, s.Ended, s.Channel}
	seen := map[string]bool{}
	for _, k := range keys {
		if Slot(k) != Slot("{a:b}") {
			t.Errorf("%s is in slot %d, not the name's %d", k, Slot(k), Slot("{a:b}"))
		}
		if seen[k] {
			t.Errorf("%s named twice", k)
		}
		seen[k] = true
	}
	if l.Hash != "p:lock:{a:b}" || s.Hash != "p:sem:{a:b}" || l.Channel != "p:lock:{a:b}:ch" {
		t.Errorf("layout changed: %q %q %q", l.Hash, s.Hash, l.Channel)
	}
}

func TestParseRecords(t *testing.T) {
	want := QueueRecord{Seq: 7, Ticket: "app/u-1", Joined: 1699999999000, Deadline: 1700000000000, Handoff: 3000, Metadata: "job 42"}
	if r, ok := ParseQueueRecord(want.String()); !ok || r != want {
		t.Errorf("ParseQueueRecord(%q) = %+v, %v", want.String(), r, ok)
	}
	if h, ok := ParseSemHolder("3:17"); !ok || h != (SemHolder{3, 17}) {
		t.Errorf("ParseSemHolder = %+v, %v", h, ok)
	}
	if w, ok := ParseSemWaiter("5:3000:2:9"); !ok || w != (SemWaiter{5, 3000, 2, 9}) {
		t.Errorf("ParseSemWaiter = %+v, %v", w, ok)
	}
	for _, bad := range []string{"", "1 t 2 3 4", "1  2 3 4 ", "x t 2 3 4 ", "1 t 2 3x 4 "} {
		if _, ok := ParseQueueRecord(bad); ok {
			t.Errorf("ParseQueueRecord(%q) accepted", bad)
		}
	}
	st, ok := ParseLockState(map[string]string{LayoutField: "3", OwnerField: "a/u-1", EndField: "1000", TokenField: "9", "{client}u": "5"})
	if !ok || st.Owner != "a/u-1" || st.Token != 9 || !st.Held(999) || st.Held(1000) || st.Clients["u"] != "5" {
		t.Errorf("ParseLockState = %+v, %v", st, ok)
	}
	if _, ok := ParseLockState(map[string]string{LayoutField: "2", "a/u-1": "1"}); ok {
		t.Error("ParseLockState read layout 2")
	}
	if _, ok := ParseSemWaiter("1:2:3"); ok {
		t.Error("ParseSemWaiter accepted 3 fields")
	}
}

func TestLabelAndPrefix(t *testing.T) {
	for id, want := range map[string]string{"web-1/42/uuid-7": "web-1/42", "uuid-7": "", "a/b-1#3": "a", HandoffPrefix + "web-1/uuid-2": "web-1"} {
		if got := Label(id); got != want {
			t.Errorf("Label(%q) = %q, want %q", id, got, want)
		}
	}
	for p, want := range map[string]bool{"redisync": true, "": false, "a{b": false, "a}": false, "x:y": true} {
		if ValidPrefix(p) != want {
			t.Errorf("ValidPrefix(%q) = %v", p, !want)
		}
	}
}

// A lock's grant channel names its lock, whatever its name and prefix;
// another primitive's does not.
func TestLockOfGrantChannel(t *testing.T) {
	for _, name := range []string{"g", "a}:ch:b", "x:lock:{y"} {
		for _, prefix := range []string{DefaultPrefix, "app:v2"} {
			k := LockKeys(prefix, name)
			got, ok := LockOfGrantChannel(k.GrantChannel("c1"))
			if !ok || got != k {
				t.Errorf("%q under %q: %+v, %v; want %+v", name, prefix, got, ok, k)
			}
		}
	}
	for _, ch := range []string{
		SemaphoreKeys(DefaultPrefix, "g").GrantChannel("c1"),
		ElectionKeys(DefaultPrefix, "g").GrantChannel("c1"),
		LockKeys(DefaultPrefix, "g").Channel,
		"redisync:lock:g:ch:c1",
	} {
		if k, ok := LockOfGrantChannel(ch); ok {
			t.Errorf("%q taken for a lock's grant channel: %+v", ch, k)
		}
	}
}

func TestSemHolderField(t *testing.T) {
	for f, want := range map[string]bool{
		"app/c1-1.abc":         true,  // a holder id
		"a#b/c1-1.abc":         true,  // a label may hold '#'
		"app/c1-1.abc#0123987": false, // a waiter id
		"{used}":               false,
		"{client}c1-1":         false,
	} {
		if got := SemHolderField(f); got != want {
			t.Errorf("SemHolderField(%q) = %v, want %v", f, got, want)
		}
	}
}

func TestParseSemUsed(t *testing.T) {
	for rec, want := range map[string][3]int64{"3:5": {3, 5, 1}, "7": {7, 0, 1}, "x": {0, 0, 0}, "-1:5": {0, 0, 0}, "2:x": {2, 0, 0}} {
		used, layout, ok := ParseSemUsed(rec)
		if ok != (want[2] == 1) || (ok && (used != want[0] || int64(layout) != want[1])) {
			t.Errorf("ParseSemUsed(%q) = %d, %d, %v", rec, used, layout, ok)
		}
	}
}
