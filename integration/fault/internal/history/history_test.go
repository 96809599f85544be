package history

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Now()

// h is a hold of owner from ms a to ms b with token tok.
func h(owner string, a, b int, tok int64) Hold {
	return Hold{Owner: owner, Who: owner, Start: t0.Add(ms(a)), End: t0.Add(ms(b)), Token: tok}
}

// p is a semaphore hold of n permits.
func p(owner string, a, b int, n int64) Hold {
	x := h(owner, a, b, 0)
	x.Permits = n
	return x
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// kinds returns the kinds of vs, joined.
func kinds(vs []Violation) string {
	var s []string
	for _, v := range vs {
		s = append(s, v.Kind)
	}
	return strings.Join(s, ",")
}

func TestMutexAcceptsValidHistories(t *testing.T) {
	for name, hs := range map[string][]Hold{
		"empty":      nil,
		"sequential": {h("a", 0, 10, 1), h("b", 10, 20, 2), h("a", 25, 30, 5)},
		"unsorted":   {h("a", 25, 30, 5), h("a", 0, 10, 1), h("b", 10, 20, 2)},
		// Goroutines sharing a value share its hold and token.
		"reentrant": {h("a", 0, 10, 1), h("a", 5, 15, 1), h("a", 12, 14, 1), h("b", 16, 20, 2)},
		"no tokens": {h("a", 0, 10, 0), h("b", 11, 20, 0)},
	} {
		if vs := Mutex(hs); len(vs) != 0 {
			t.Errorf("%s: valid history rejected: %v", name, vs)
		}
	}
}

func TestMutexRejectsViolations(t *testing.T) {
	for name, c := range map[string]struct {
		holds []Hold
		want  string
	}{
		"overlap":           {[]Hold{h("a", 0, 10, 1), h("b", 5, 15, 2)}, "overlap"},
		"contained":         {[]Hold{h("a", 0, 30, 1), h("b", 5, 15, 2)}, "overlap"},
		"overlap untokened": {[]Hold{h("a", 0, 10, 0), h("b", 9, 15, 0)}, "overlap"},
		// The stale hand-off: the same value's later call adopts a grant
		// while another value holds.
		"phantom":        {[]Hold{h("a", 0, 10, 1), h("b", 10, 30, 3), h("a", 12, 13, 2)}, "overlap,token order"},
		"token back":     {[]Hold{h("a", 0, 10, 5), h("b", 11, 20, 4)}, "token order"},
		"token again":    {[]Hold{h("a", 0, 10, 5), h("b", 11, 20, 5)}, "token order"},
		"token shared":   {[]Hold{h("a", 0, 10, 5), h("b", 11, 20, 6), h("c", 21, 30, 6)}, "token order"},
		"own token back": {[]Hold{h("a", 0, 10, 5), h("a", 11, 20, 4)}, "token order"},
		"after others":   {[]Hold{h("a", 0, 10, 5), h("b", 11, 20, 6), h("a", 21, 30, 6)}, "token order"},
		"token stolen":   {[]Hold{h("a", 0, 10, 7), h("b", 2, 3, 7)}, "overlap,token order"},
		"three at once":  {[]Hold{h("a", 0, 10, 1), h("b", 1, 10, 2), h("c", 2, 10, 3)}, "overlap,overlap,overlap"},
	} {
		if got := kinds(Mutex(c.holds)); got != c.want {
			t.Errorf("%s: got violations %q, want %q", name, got, c.want)
		}
	}
}

func TestSemaphore(t *testing.T) {
	for name, c := range map[string]struct {
		holds []Hold
		size  int64
		want  int // violations
	}{
		"fits":        {[]Hold{p("a", 0, 10, 2), p("b", 0, 10, 1), p("c", 10, 20, 3)}, 3, 0},
		"touching":    {[]Hold{p("a", 0, 10, 3), p("b", 10, 20, 3)}, 3, 0},
		"zero is one": {[]Hold{p("a", 0, 10, 0), p("b", 0, 10, 0)}, 2, 0},
		"over":        {[]Hold{p("a", 0, 10, 2), p("b", 5, 15, 2)}, 3, 1},
		// Partial release: a's two permits become one at 5.
		"partial ok":  {[]Hold{p("a", 0, 5, 1), p("a", 0, 10, 1), p("b", 5, 10, 2)}, 3, 0},
		"partial bad": {[]Hold{p("a", 0, 6, 1), p("a", 0, 10, 1), p("b", 5, 10, 2)}, 3, 1},
		"two excursions": {[]Hold{
			p("a", 0, 10, 2), p("b", 5, 12, 2), p("c", 6, 8, 1),
			p("d", 20, 30, 3), p("e", 25, 26, 1),
		}, 3, 2},
	} {
		vs := Semaphore(c.holds, c.size)
		if len(vs) != c.want {
			t.Errorf("%s: %d violations, want %d: %v", name, len(vs), c.want, vs)
		}
	}
	// The violation is reported at the peak of its excursion.
	vs := Semaphore([]Hold{p("a", 0, 10, 2), p("b", 5, 12, 2), p("c", 6, 8, 1)}, 3)
	if len(vs) != 1 || len(vs[0].Holds) != 3 || !vs[0].At.Equal(t0.Add(ms(6))) {
		t.Errorf("excursion not reported at its peak: %v", vs)
	}
}

func TestOverlaps(t *testing.T) {
	hs := []Hold{h("a", 0, 10, 1), h("b", 10, 20, 2), h("a", 30, 40, 3)}
	for _, c := range []struct {
		owner string
		a, b  int
		want  bool
	}{
		{"c", 5, 6, true},
		{"a", 5, 6, false}, // its own hold
		{"a", 15, 16, true},
		{"c", 21, 29, false},
		{"b", 25, 35, true},
		{"c", 41, 50, false},
	} {
		if got := Overlaps(hs, c.owner, t0.Add(ms(c.a)), t0.Add(ms(c.b)), 8); got != c.want {
			t.Errorf("Overlaps(%s, %d, %d) = %v, want %v", c.owner, c.a, c.b, got, c.want)
		}
	}
}
