// Package redisinfo reads which server answers, from the text of INFO:
// the library reports it (Client.Servers) and the test harness names it
// beside every package's results.
package redisinfo

import (
	"cmp"
	"strings"
)

// Server is what INFO says of a server.
type Server struct {
	Name    string // "redis" or "valkey"
	Version string // the server's own version
	Mode    string // "standalone", "cluster" or "sentinel"
	Role    string // "primary" or "replica"
}

// Parse reads a Server from the text of INFO (its server and replication
// sections). Valkey names itself in server_name and gives its own version
// in valkey_version (its redis_version stays 7.2.4), and its mode in
// server_mode where Redis has redis_mode.
func Parse(info string) Server {
	fields := make(map[string]string)
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	s := Server{Name: "redis", Version: fields["redis_version"], Mode: fields["redis_mode"], Role: "primary"}
	if name := fields["server_name"]; name != "" {
		s.Name = name
		s.Version = cmp.Or(fields[name+"_version"], s.Version)
		s.Mode = cmp.Or(fields["server_mode"], s.Mode)
	}
	if fields["role"] == "slave" {
		s.Role = "replica"
	}
	return s
}

// String returns the server as "valkey 8.1.1 (standalone primary)".
func (s Server) String() string {
	return s.Name + " " + s.Version + " (" + s.Mode + " " + s.Role + ")"
}
