package redisync

import "github.com/redisync/redisync/internal/kithook"

// The testing kit's ways into a Client (see internal/kithook). They add
// nothing to a Client that the kit does not call.
func init() {
	kithook.ID = func(c any) string { return c.(*Client).id }
	kithook.RenewNow = func(c any) { c.(*Client).wd.RenewNow() }
	kithook.Lose = func(c any, key, owner string) bool { return c.(*Client).wd.Lose("hold", key, owner) }
	kithook.Wake = func(c any, channel string) { c.(*Client).sub.reg.Wake(channel) }
	kithook.WakeAll = func(c any) { c.(*Client).sub.reg.WakeAll() }
	kithook.DropHolds = func(c any) ([]string, []string) { return c.(*Client).wd.DropHolds("hold") }
}
