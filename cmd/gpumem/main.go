// Command gpumem runs gpumem's caching allocator on the simulated device:
// a demo training loop, replays of allocation traces, side-by-side
// comparisons of configurations, and conversion of other tools' logs to
// memtrace.
//
// Usage:
//
//	gpumem demo [--steps N] [--conf CONF]
//	gpumem replay [--conf CONF] [--capacity SIZE] [--baseline] [--json] [--summary] [--snapshot OUT.pickle] TRACE...
//	gpumem compare [--conf CONF]... [--capacity SIZE] TRACE
//	gpumem convert [-o OUT] FILE
//	gpumem estimate (--model NAME | --config FILE | --params 7B | --layers N --hidden N) [--mode ...] [--card NAME] [--json]
//	gpumem viz [-o OUT.svg] [--conf CONF] [--capacity SIZE] TRACE
//
// CONF uses PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax, for example
// "max_split_size_mb:128,garbage_collection_threshold:0.6". SIZE accepts
// 80GiB, 512MiB or plain bytes.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError marks errors in the command line (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

const usage = `gpumem: a caching GPU memory allocator, faithful to PyTorch, on a simulated device.

Usage:
  gpumem demo [--steps N] [--conf CONF]            run a small training loop and print the memory summary
  gpumem replay [flags] TRACE...                   replay allocation traces and print what they cost
  gpumem compare --conf A --conf B ... TRACE       replay one trace under several configurations side by side
  gpumem convert [-o OUT] FILE                     convert a PyTorch snapshot or RMM log to memtrace
  gpumem estimate --model NAME [--card NAME ...]   will this model fit on this card, and what to change
  gpumem viz [-o OUT.svg] [--conf CONF] TRACE      draw a replay: memory timeline and segment map (SVG)

Run 'gpumem COMMAND --help' for a command's flags.
`

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "demo":
		err = runDemo(args[1:], stdout, stderr)
	case "replay":
		err = runReplay(args[1:], stdout, stderr)
	case "compare":
		err = runCompare(args[1:], stdout, stderr)
	case "convert":
		err = runConvert(args[1:], stdout, stderr)
	case "estimate":
		err = runEstimate(args[1:], stdout, stderr)
	case "viz":
		err = runViz(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "gpumem: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintf(stderr, "gpumem %s: %v\n", args[0], err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// newFlags returns a FlagSet for a subcommand that writes its usage to
// stderr and returns errors instead of exiting.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gpumem "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gpumem %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, turning flag errors into usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	return nil
}
