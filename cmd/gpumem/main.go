// Command gpumem runs gpumem's caching allocator on the simulated device:
// a demo training loop, replays of allocation traces, side-by-side
// comparisons of configurations, conversion of other tools' logs to
// memtrace, pictures, and answers from a trace: the smallest device it
// runs on (fit), its memory at a bigger batch (scale) and the best
// configuration (tune).
//
// Usage:
//
//	gpumem demo [--steps N] [--layers N] [--conf CONF] [--capacity SIZE]
//	gpumem replay [--conf CONF] [--capacity SIZE | --card NAME [--overhead SIZE]] [--baseline] [--json] [--summary] [--fail-on-oom] [--snapshot OUT.pickle] [--history N] TRACE...
//	gpumem compare [--conf CONF]... [--capacity SIZE | --card NAME [--overhead SIZE]] [--json] TRACE
//	gpumem convert [-o OUT] [--device N] FILE
//	gpumem estimate (--model NAME | --config FILE | --params 7B | --layers N --hidden N) [--mode ...] [--card NAME | --capacity SIZE] [--max-batch] [--json]
//	gpumem viz [-o OUT.svg] [--conf CONF] [--capacity SIZE | --card NAME [--overhead SIZE]] TRACE
//	gpumem fit [--conf CONF]... [--checks N] [--overhead SIZE] [--json] TRACE...
//	gpumem scale --probe FILE@BATCH --probe FILE@BATCH [--probe FILE@BATCH]... --batch N [--capacity SIZE | --card NAME [--overhead SIZE]] [--conf CONF] [--json] [--write OUT]
//	gpumem tune [--capacity SIZE | --card NAME [--overhead SIZE]] [--conf CONF]... [--jobs N] [--all] [--json] TRACE
//	gpumem version
//	gpumem help [COMMAND]
//
// A TRACE is a memtrace (plain or gzip), a PyTorch memory snapshot pickle
// (torch.cuda.memory._dump_snapshot) or an RMM log, told apart by their
// content. CONF uses PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax, for
// example "max_split_size_mb:128,garbage_collection_threshold:0.6";
// without --conf the command reads GPUMEM_ALLOC_CONF, then
// PYTORCH_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF, and says on stderr
// which configuration it used and where it came from. Flags may come
// before or after the other arguments. SIZE accepts 80GiB, 512MiB or plain bytes; NAME
// is a card such as a100-80g.
//
// Exit status: 0 on success, 1 on an error, 2 on a usage error (including
// a bad configuration in the environment), 3 when replay --fail-on-oom
// saw an allocation run out of memory, 130 or 143 when SIGINT (Ctrl-C) or
// SIGTERM stopped the command, which then says so in one line.
//
// Long work (replays, fit, scale, tune, estimate --max-batch and
// --max-seq) shows its progress on stderr: a bar on a terminal, and
// otherwise a line every few seconds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(runContext(stopOnSignal(), os.Args[1:], os.Stdout, os.Stderr))
}

// interruptGrace is how long a command has, after SIGINT or SIGTERM, to
// stop by itself before the signal ends the process.
const interruptGrace = 2 * time.Second

// interruptGraceSetting, when a build sets it to a duration
// (go build -ldflags "-X main.interruptGraceSetting=1m"), replaces
// interruptGrace. The signal tests build the command with a minute, so
// that on a loaded machine a command that is stopping by itself is not
// ended by the signal first: what they check is that it stops by itself,
// not how fast.
var interruptGraceSetting string

// grace returns interruptGrace, or the duration the build set.
func grace() time.Duration {
	if d, err := time.ParseDuration(interruptGraceSetting); err == nil && d > 0 {
		return d
	}
	return interruptGrace
}

// interrupted is the cause of the context of a command stopped by a
// signal.
type interrupted struct{ sig os.Signal }

func (e interrupted) Error() string { return "interrupted by " + signalName(e.sig) }

// status is the exit status of a process ended by the signal: 128 plus
// its number, as a shell reports it.
func (e interrupted) status() int {
	if s, ok := e.sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

func signalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

// stopOnSignal returns the context of the command, done at SIGINT or
// SIGTERM. The signal first removes the temporary files of the outputs
// being written and ends the context: the long work (replays, fit, scale,
// tune, estimate's searches) checks it and returns, and run reports the
// interruption in one line with the status 128 + the signal's number.
// Work that cannot see the context (a read that waits on a pipe) is ended
// by the signal itself after the grace (interruptGrace, or what the build
// set), and a second signal ends it at once, as it would have ended
// without the handler.
func stopOnSignal() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-ch
		temps.removeTemps(false)
		cancel(interrupted{sig})
		select {
		case sig = <-ch:
		case <-time.After(grace()):
		}
		temps.removeTemps(true)
		signal.Reset(sig)
		if p, err := os.FindProcess(os.Getpid()); err == nil && p.Signal(sig) == nil {
			time.Sleep(5 * time.Second) // the signal ends the process; a loaded machine may take a moment
		}
		os.Exit(interrupted{sig}.status())
	}()
	return ctx
}

// usageError marks errors in the command line (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// exitError is an error with its own exit status.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

const usage = `gpumem: a caching GPU memory allocator, faithful to PyTorch, on a simulated device.

Usage:
  gpumem demo [flags]                          run a small training loop and print the memory summary
  gpumem replay [flags] TRACE...               replay allocation traces and print what they cost
  gpumem compare [--conf CONF]... TRACE        replay one trace under several configurations side by side
  gpumem convert [-o OUT] FILE                 convert a PyTorch snapshot or RMM log to memtrace
  gpumem estimate [flags]                      will this transformer train on this card
  gpumem viz [-o OUT.svg] TRACE                draw a replay: memory timeline and segment map (SVG)
  gpumem fit [--conf CONF]... TRACE...         the smallest device each trace runs on
  gpumem scale --probe FILE@BATCH... --batch N predict a trace at a bigger batch from small probes
  gpumem tune [--capacity SIZE] TRACE          find the allocator configuration that serves a trace best
  gpumem version                               print the version

A TRACE is a memtrace, a PyTorch memory snapshot or an RMM log. Without
--conf, commands read GPUMEM_ALLOC_CONF, then PYTORCH_ALLOC_CONF, then
PYTORCH_CUDA_ALLOC_CONF; each says on stderr which configuration it used.
Run 'gpumem help COMMAND' or 'gpumem COMMAND --help' for a command's flags;
flags may come before or after the other arguments.
`

// commands maps each command to its function. The long work stops when
// ctx is done.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"demo":     runDemo,
	"replay":   runReplay,
	"compare":  runCompare,
	"convert":  runConvert,
	"estimate": runEstimate,
	"viz":      runViz,
	"fit":      runFit,
	"scale":    runScale,
	"tune":     runTune,
	"version":  runVersion,
}

// runVersion prints the version.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{"version takes no arguments"}
	}
	_, err := fmt.Fprintln(stdout, versionString())
	return err
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext executes the command line args and returns the exit status.
// What the command writes to stdout is checked: a failed write is an
// error (exit status 1), reported in one line. A command that fails once
// ctx is done by a signal (stopOnSignal) says so in one line, with the
// status 128 + the signal's number.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	name := args[0]
	out := &checkedWriter{w: stdout}
	var err error
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) < 2 {
			fmt.Fprint(out, usage)
			break
		}
		// help CMD: the command's own help, on stdout as asked for.
		if len(args) > 2 {
			fmt.Fprintln(stderr, "gpumem help: give one command (run 'gpumem help')")
			return 2
		}
		cmd, ok := commands[args[1]]
		if !ok {
			fmt.Fprintf(stderr, "gpumem help: unknown command %s (run 'gpumem help')\n", quote(args[1]))
			return 2
		}
		err = cmd(ctx, []string{"--help"}, out, out)
	case "--version", "-version":
		name = "version"
		err = commands[name](ctx, args[1:], out, stderr)
	default:
		cmd, ok := commands[name]
		if !ok {
			fmt.Fprintf(stderr, "gpumem: unknown command %s (run 'gpumem help')\n", quote(name))
			return 2
		}
		err = cmd(ctx, args[1:], out, stderr)
	}
	if out.err != nil {
		// The output error first: the command's own error is often the
		// same failure seen later.
		fmt.Fprintf(stderr, "gpumem %s: writing standard output: %s\n", name, oneLine(out.err.Error()))
		return 1
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var stop interrupted
	if errors.As(context.Cause(ctx), &stop) {
		fmt.Fprintf(stderr, "gpumem %s: %s\n", name, stop)
		return stop.status()
	}
	fmt.Fprintf(stderr, "gpumem %s: %s\n", name, oneLine(err.Error()))
	var ue usageError
	var ee exitError
	switch {
	case errors.As(err, &ue):
		return 2
	case errors.As(err, &ee):
		return ee.code
	}
	return 1
}

// version is the release, set at build time with
// -ldflags "-X main.version=v1.2.3"; otherwise the module's build
// information says what it can.
var version = ""

// versionString returns "gpumem VERSION (REVISION), GO OS/ARCH".
func versionString() string {
	v := version
	var rev, modified, pgo string
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = ", modified"
				}
			case "-pgo": // the profile's path where it was built: not said
				if s.Value != "" {
					pgo = ", profile-guided"
				}
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	s := "gpumem " + v
	if rev != "" {
		s += " (" + rev[:min(12, len(rev))] + modified + ")"
	}
	return s + ", " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + pgo
}

// flagSet is a subcommand's flags and its help.
type flagSet struct {
	*flag.FlagSet
	help   func()
	stderr io.Writer
	// args are the positional arguments, from anywhere on the command
	// line (parseFlags); Args, NArg and Arg read them, not the FlagSet's
	// remainder.
	args []string
	// confLine, if set, says which configuration the command uses; begin
	// prints it.
	confLine string
}

// begin marks the start of the command's work: it says on stderr, once,
// which configuration the command uses and where it came from.
func (fs *flagSet) begin() {
	if fs.confLine != "" {
		fmt.Fprint(fs.stderr, fs.confLine)
		fs.confLine = ""
	}
}

// Args returns the positional arguments.
func (fs *flagSet) Args() []string { return fs.args }

// NArg returns the number of positional arguments.
func (fs *flagSet) NArg() int { return len(fs.args) }

// Arg returns the i-th positional argument, or "" if there is none.
func (fs *flagSet) Arg(i int) string {
	if i < 0 || i >= len(fs.args) {
		return ""
	}
	return fs.args[i]
}

// newFlags returns the flags of a subcommand, whose help (-h, --help)
// names the flags as the synopsis does: one dash for a one-letter flag,
// two for the others. Write a flag's value name in backquotes in its
// usage text, as the synopsis writes it.
func newFlags(name, synopsis string, stderr io.Writer) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet("gpumem "+name, flag.ContinueOnError), stderr: stderr}
	// Parse prints nothing: parseFlags reports errors in one line, and
	// prints the help when asked.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.help = func() {
		fmt.Fprintf(stderr, "Usage: %s\n", strings.TrimSpace("gpumem "+name+" "+synopsis))
		first := true
		fs.VisitAll(func(f *flag.Flag) {
			if first {
				fmt.Fprint(stderr, "\nFlags:\n")
				first = false
			}
			value, text := flag.UnquoteUsage(f)
			line := "  " + flagName(f.Name)
			if value != "" {
				line += " " + value
			}
			fmt.Fprintf(stderr, "%s\n    \t%s", line, strings.ReplaceAll(text, "\n", "\n    \t"))
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				fmt.Fprintf(stderr, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(stderr)
		})
	}
	return fs
}

// flagName spells a flag as the usage lines do.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// parseFlags parses args, turning flag errors into usage errors in one
// line, with flags spelled as the help spells them. Flags may come before,
// between or after the positional arguments, as Go's own commands take
// them; after "--" every argument is positional ("-" alone is one too).
func parseFlags(fs *flagSet, args []string) error {
	fs.args = nil
	var err error
	for {
		if err = fs.Parse(args); err != nil {
			break
		}
		rest := fs.FlagSet.Args()
		if len(rest) == 0 {
			return nil
		}
		if len(args)-len(rest) > 0 && args[len(args)-len(rest)-1] == "--" {
			// flag.Parse stopped at "--": the rest is positional.
			fs.args = append(fs.args, rest...)
			return nil
		}
		fs.args = append(fs.args, rest[0])
		args = rest[1:]
	}
	if errors.Is(err, flag.ErrHelp) {
		fs.help()
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag " + clip(flagName(name))
	}
	fs.VisitAll(func(f *flag.Flag) {
		for _, pat := range []string{"flag -%s:", "for -%s:", ": -%s"} {
			old := fmt.Sprintf(pat, f.Name)
			if strings.Contains(msg, old) && (!strings.HasPrefix(pat, ": ") || strings.HasSuffix(msg, old)) {
				msg = strings.Replace(msg, old, strings.Replace(old, "-"+f.Name, flagName(f.Name), 1), 1)
			}
		}
	})
	return usageError{msg + " (see " + fs.Name() + " --help)"}
}

// flagGiven reports whether the flag called name was set on the command
// line.
func flagGiven(fs *flagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
