package redisync

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Issue 15, point 5: an option given where it does not apply does not
// compile. testdata/misuse gives six; the compiler must refuse each line.
func TestOptionMisuseDoesNotCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the compiler")
	}
	src := filepath.Join("testdata", "misuse", "main.go")
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{} // line -> what it misuses
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if _, what, ok := strings.Cut(sc.Text(), "// misuse: "); ok {
			want[n] = what
		}
	}
	_ = f.Close()
	if len(want) != 6 {
		t.Fatalf("%d misuses in %s, want 6", len(want), src)
	}
	out, err := exec.Command("go", "build", "-o", os.DevNull, "./testdata/misuse").CombinedOutput()
	if err == nil {
		t.Fatalf("go build of %s succeeded; want it refused", src)
	}
	refused := map[int]bool{}
	for _, m := range regexp.MustCompile(`main\.go:(\d+):\d+: .*does not implement`).FindAllStringSubmatch(string(out), -1) {
		n, _ := strconv.Atoi(m[1])
		refused[n] = true
	}
	for n, what := range want {
		if !refused[n] {
			t.Errorf("line %d (%s) compiled; go build said:\n%s", n, what, out)
		}
	}
	if len(refused) != len(want) {
		t.Errorf("refused lines %v, want exactly %v:\n%s", refused, want, out)
	}
}

// Issue 15, point 5: constructors that can meet bad input return an
// error, instead of deferring it to the first call.
func TestConstructorsRefuseBadInput(t *testing.T) {
	_, rdb, cnt := newMini(t)
	var typedNil *redis.Client
	for _, tc := range []struct {
		what string
		rdb  redis.UniversalClient
		opts []ClientOption
		want error
	}{
		{"nil client", nil, nil, ErrNilClient},
		{"typed nil client", typedNil, nil, ErrNilClient},
		{"bad lease", rdb, []ClientOption{WithLease(0)}, ErrInvalidOption},
		{"bad label", rdb, []ClientOption{WithLabel("a b")}, ErrInvalidOption},
	} {
		if c, err := New(tc.rdb, tc.opts...); c != nil || !errors.Is(err, tc.want) {
			t.Errorf("New, %s: %v, %v; want nil, %v", tc.what, c, err, tc.want)
		}
	}
	c, err := New(rdb)
	if err != nil || c == nil {
		t.Fatalf("New of a good client: %v, %v", c, err)
	}
	_ = c.Close()
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands sent", n)
	}
}
