package redisyncotel

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDocListsEveryPrimitive: the package doc lists every value of
// redisync.Primitive (read from redisync's observe.go) that the
// redisync.primitive attribute takes.
func TestDocListsEveryPrimitive(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../observe.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Primitive" {
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok {
						s, _ := strconv.Unquote(lit.Value)
						values = append(values, s)
					}
				}
			}
		}
		return true
	})
	if len(values) == 0 {
		t.Fatal("found no Primitive constants in ../observe.go")
	}
	src, err := os.ReadFile("otel.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`redisync\.primitive \(([^)]*)\)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("the package doc has no list of redisync.primitive's values")
	}
	listed := map[string]bool{}
	for _, v := range strings.Split(strings.ReplaceAll(string(m[1]), "\n//", ""), ",") {
		listed[strings.TrimSpace(v)] = true
	}
	for _, v := range values {
		if !listed[v] {
			t.Errorf("the package doc's redisync.primitive list (%s) lacks %q", m[1], v)
		}
	}
}
