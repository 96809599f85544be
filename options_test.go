package redisync

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
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
