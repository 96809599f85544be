// Command fipsimport imports redisync and exits. CI runs it with
// GODEBUG=fips140=only, in which a package that uses SHA-1 (or another
// algorithm outside FIPS 140) while loading makes the program panic
// before main.
package main

import (
	"fmt"

	"github.com/redisync/redisync"
)

func main() {
	fmt.Println("redisync loaded; default crash timeout", redisync.DefaultCrashTimeout)
}
