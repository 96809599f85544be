// Command redisync runs a command while holding a distributed lock or
// semaphore kept in Redis, shows who holds and who waits for one, and
// demonstrates both on an embedded Redis.
//
// Run "redisync help" for the usage and the exit codes.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Exit codes. A command run by lock, sem or elect passes its own exit
// code through, and 128+N when it was killed by signal N. exitBusy,
// exitTimeout and exitLost are the defaults of --busy-exit, --timeout-exit
// and --lost-exit.
const (
	exitOK          = 0
	exitFree        = 1   // status: neither the lock nor any permit is held
	exitUsage       = 64  // bad flags or arguments, bad Redis URL (EX_USAGE)
	exitUnavailable = 69  // Redis unreachable or refused the connection (EX_UNAVAILABLE)
	exitBusy        = 73  // --no-wait: the lock, permits or leadership are taken
	exitSoftware    = 70  // Redis error, a key of the wrong type, a failed demo check (EX_SOFTWARE)
	exitTimeout     = 75  // --wait ran out before the lock, permits or leadership were acquired (EX_TEMPFAIL)
	exitLost        = 76  // the lock, permits or leadership were lost while the command ran
	exitCannotRun   = 126 // the command was found but could not be started
	exitNotFound    = 127 // the command was not found
	exitSignal      = 128 // + N: interrupted by signal N
)

const usageHead = `redisync: distributed locks and semaphores on Redis, from the shell.

Usage:
`

const usageTail = `
Run "redisync COMMAND --help" for a command's flags and examples.

Exit codes:
  0        success (lock, sem, elect: CMD exited 0; status: held)
  1        status: free (neither the lock nor any permit is held)
  1-125    lock, sem, elect: CMD's own exit code
  64       usage error: bad flag or argument, missing CMD after --, bad Redis URL
  69       Redis unreachable, or it refused the connection (auth, TLS)
  70       Redis error (e.g. a key of the wrong type); demo: a check failed
  73       -n/--no-wait: the lock, permits or leadership are taken (--busy-exit)
  75       --wait ran out before the lock, permits or leadership were
           acquired (--timeout-exit)
  76       the lock, permits or leadership were lost while CMD ran; CMD was
           terminated (--lost-exit)
  126      CMD could not be started
  127      CMD not found
  128+N    redisync or CMD was interrupted by signal N (130: SIGINT, 143: SIGTERM)

73, 75 and 76 may be CMD's own exit codes too. To tell them apart, lock, sem
and elect take --busy-exit N, --timeout-exit N and --lost-exit N (N in
1-255, not 64, 69, 70 nor 126-192, which redisync and signals use):
redisync exits with N instead, as flock -E does; pick codes that CMD
never uses, such as 200 and up.
`

// usage returns the top-level help: the commands, in order, and the exit
// codes.
func usage() string {
	var b strings.Builder
	b.WriteString(usageHead)
	help := &command{name: "help", synopsis: "[COMMAND]", summary: "show this text, or a command's help"}
	ver := &command{name: "version", summary: "show redisync's version (also --version)"}
	all := append(slices.Clone(commands), help, ver)
	nameWidth, width := 0, 0
	for _, c := range all {
		nameWidth, width = max(nameWidth, len(c.name)), max(width, len(c.synopsis))
	}
	for _, c := range all {
		fmt.Fprintf(&b, "  redisync %-*s %-*s  %s\n", nameWidth, c.name, width, c.synopsis, c.summary)
	}
	b.WriteString("\n" + redisHelp)
	b.WriteString(usageTail)
	return b.String()
}

// command is one subcommand.
type command struct {
	name     string
	synopsis string // arguments, for the usage
	summary  string // what it does, for the usage
	run      func(args []string) int
	help     string
}

// commands are the subcommands in the order the usage lists them.
var commands = []*command{
	{"lock", "[flags] NAME [-- CMD [ARGS...]]", "run CMD while holding lock NAME (no CMD: hold until a signal)", runLock, lockHelp},
	{"sem", "--limit N [flags] NAME [-- CMD...]", "run CMD while holding permits of semaphore NAME", runSem, semHelp},
	{"elect", "[flags] NAME [-- CMD [ARGS...]]", "run CMD while this process leads election NAME", runElect, electHelp},
	{"status", "[flags] NAME|--all", "show who holds NAME and who waits, in order (--all: everything)", runStatus, statusHelp},
	{"demo", "[flags]", "watch simulated clients contend (embedded Redis)", runDemo, demoHelp},
}

// lookup returns the command called name, or nil.
func lookup(name string) *command {
	i := slices.IndexFunc(commands, func(c *command) bool { return c.name == name })
	if i < 0 {
		return nil
	}
	return commands[i]
}

func main() {
	// go-redis logs dial failures and Sentinel events on stderr, ahead of
	// redisync's own message; every error that matters reaches redisync
	// as an error, and is reported once.
	redis.SetLogger(quietLogger{})
	os.Exit(run(os.Args[1:]))
}

// quietLogger drops go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// run dispatches to a subcommand and returns the exit code.
func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage())
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case guardCommand:
		return runGuard(rest)
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 {
			if c := lookup(rest[0]); c != nil {
				fmt.Fprint(os.Stdout, c.help)
				return exitOK
			}
			return usageError("help", fmt.Errorf("unknown command %q", rest[0]))
		}
		fmt.Fprint(os.Stdout, usage())
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(os.Stdout, version())
		return exitOK
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(os.Stderr, "redisync: unknown command %q\n\n%s", name, usage())
		return exitUsage
	}
	return c.run(rest)
}

// version returns "redisync VERSION GOVERSION": the module version it
// was built from ("(devel)" from a work tree, with the VCS revision).
func version() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = cmp.Or(bi.Main.Version, v)
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && v == "(devel)" {
				v += " " + s.Value
			}
		}
	}
	return "redisync " + v + " " + runtime.Version()
}

// newFlags returns an empty flag set for a subcommand. Errors are
// reported by parseArgs, not by the flag package.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("redisync "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parsed is a subcommand's command line after its flags.
type parsed struct {
	pos      []string // positional arguments, in order
	cmd      []string // what follows "--"
	dashdash bool     // whether there was a "--"
}

// errHelp is returned by parseArgs when --help was asked for; the help
// has been printed.
var errHelp = errors.New("help requested")

// parseArgs parses fs's flags, which may come before, between and after
// the positional arguments, up to the first "--"; everything after it is
// returned untouched as the command to run. On -h/--help it prints help
// to stdout and returns errHelp.
func parseArgs(fs *flag.FlagSet, help string, args []string) (parsed, error) {
	var p parsed
	if i := slices.Index(args, "--"); i >= 0 {
		p.cmd, p.dashdash, args = args[i+1:], true, args[:i]
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printHelp(fs, help)
				return p, errHelp
			}
			return p, flagError(fs, err)
		}
		if fs.NArg() == 0 {
			return p, nil
		}
		p.pos = append(p.pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// badValue matches the flag package's message for a bad flag value.
var badValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for flag -(\S+): (.*)$`)

// flagError rewrites the flag package's message for a bad value as
// "--wait 5: missing unit, e.g. 5s".
func flagError(fs *flag.FlagSet, err error) error {
	m := badValue.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	why := m[3]
	if why == "parse error" {
		why = "not a number"
		if b, ok := fs.Lookup(m[2]).Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			why = "want true or false"
		}
	}
	return fmt.Errorf("--%s %s: %s", m[2], m[1], why)
}

// durationValue is a flag.Value for a duration whose errors say what is
// wrong.
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil || *v.d == 0 {
		return "" // no "(default 0s)" in the help
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err == nil:
		*v.d = d
		return nil
	case s == "":
		return errors.New("empty duration, e.g. 30s")
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return fmt.Errorf("missing unit, e.g. %ss", s)
	}
	return errors.New("not a duration, e.g. 500ms, 30s, 5m or 1h30m")
}

// durationFlag adds a duration flag to fs. Its usage should name the
// value `duration`, in backquotes, for the help.
func durationFlag(fs *flag.FlagSet, name string, value time.Duration, usage string) *time.Duration {
	d := value
	fs.Var(durationValue{&d}, name, usage)
	return &d
}

// printHelp prints a subcommand's help text followed by its flags.
func printHelp(fs *flag.FlagSet, help string) {
	fmt.Fprint(os.Stdout, help)
	fmt.Fprintln(os.Stdout, "\nFlags (-flag and --flag are the same):")
	fs.SetOutput(os.Stdout)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// usageError reports a usage error of subcommand cmd and returns
// exitUsage.
func usageError(cmd string, err error) int {
	fmt.Fprintf(os.Stderr, "redisync %s: %v\nRun 'redisync %s --help' for usage.\n", cmd, err, cmd)
	return exitUsage
}

// errorf prints an error message prefixed with "redisync: " and returns
// code.
func errorf(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "redisync: "+format+"\n", args...)
	return code
}

// checkPrefix validates a --prefix value, as redisync.WithKeyPrefix does.
func checkPrefix(p string) error {
	if p == "" || strings.ContainsAny(p, "{}") {
		return fmt.Errorf("--prefix %q must be non-empty and without braces", p)
	}
	return nil
}

// checkName validates a lock or semaphore name given on the command line.
func checkName(name string) error {
	if name == "" {
		return errors.New("NAME must not be empty")
	}
	return nil
}
