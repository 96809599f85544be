package layout2

import (
	"testing"

	"github.com/redisync/redisync/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }
