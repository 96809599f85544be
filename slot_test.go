package redisync

import "testing"

func TestSlotOfMatchesRedisCluster(t *testing.T) {
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
		if got := slotOf(key); got != want {
			t.Errorf("slotOf(%q) = %d, want %d", key, got, want)
		}
	}
}
