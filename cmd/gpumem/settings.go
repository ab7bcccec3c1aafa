// This file holds the settings every command shares: the allocator
// configuration (--conf, or the environment) and the device (--capacity
// or --card).

package main

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/estimate"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace/plan"
)

// envConf returns the configuration from the environment
// (allocator.LookupConfEnv: GPUMEM_ALLOC_CONF, then PYTORCH_ALLOC_CONF,
// then PYTORCH_CUDA_ALLOC_CONF) and the variable's name; ("", "") if none
// is set. A value that does not parse is a usage error naming the
// variable.
func envConf() (conf, from string, err error) {
	s, v := allocator.LookupConfEnv()
	if v == "" {
		return "", "", nil
	}
	if _, err := allocator.ParseConf(s); err != nil {
		return "", v, usageError{fmt.Sprintf("%s: %v", v, err)}
	}
	return s, v, nil
}

// parseConf parses a --conf value; a bad one is a usage error.
func parseConf(conf string) (allocator.Config, error) {
	c, err := allocator.ParseConf(conf)
	if err != nil {
		return allocator.Config{}, usageError{"--conf: " + err.Error()}
	}
	return c, nil
}

// envOrder names the variables read without --conf, in the order
// allocator.LookupConfEnv reads them: "GPUMEM_ALLOC_CONF, then
// PYTORCH_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF".
var envOrder = strings.Join(allocator.ConfEnvVars(), ", then ")

// confFlagHelp is the help of a --conf flag taking one configuration.
var confFlagHelp = "allocator configuration `CONF`, PYTORCH_CUDA_ALLOC_CONF syntax (default: " + envOrder + ")"

// confSource is the configuration a command used and where it came from:
// "--conf", the environment variable's name, or "" for the default.
type confSource struct {
	Conf string `json:"conf"`
	From string `json:"conf_from"`
}

// reportConf notes which configurations the command uses and where they
// came from, as "gpumem CMD: configuration X (from --conf)", for
// fs.begin to say once on stderr when the work starts (a usage error
// found before stays one line). def describes a default list ("" for
// PyTorch's default).
func reportConf(fs *flagSet, confs []string, from, def string) {
	labels := make([]string, len(confs))
	for i, c := range confs {
		labels[i] = clip(confLabel(c))
		if strings.TrimSpace(c) == "" {
			labels[i] = "PyTorch's default"
		}
	}
	what := "configuration "
	if len(confs) != 1 {
		what = "configurations "
	}
	var where string
	switch from {
	case "--conf":
		where = "from --conf"
	case "", "default":
		where = "none of --conf, " + strings.Join(allocator.ConfEnvVars(), ", ") + " is set"
		if def != "" {
			where = def + ": " + where
		}
	default:
		where = "from " + from
	}
	if len(confs) == 0 {
		// Nothing but the command's own list (tune's sweep): def names it.
		labels, what, where = []string{def}, "configurations ", strings.TrimPrefix(where, def+": ")
	}
	fs.confLine = fmt.Sprintf("%s: %s%s (%s)\n", fs.Name(), what, strings.Join(labels, "; "), where)
}

// resolveConf returns the configuration of a command with one --conf
// flag: the flag's value if given, else the environment's; and says on
// stderr which it is.
func resolveConf(fs *flagSet, conf string) (allocator.Config, confSource, error) {
	src := confSource{Conf: conf, From: "--conf"}
	if !flagGiven(fs, "conf") {
		s, from, err := envConf()
		if err != nil {
			return allocator.Config{}, confSource{}, err
		}
		src = confSource{Conf: s, From: cmp.Or(from, "default")}
	}
	c, err := parseConf(src.Conf)
	if err != nil {
		return allocator.Config{}, confSource{}, err
	}
	reportConf(fs, []string{src.Conf}, src.From, "")
	return c, src, nil
}

// resolveConfs returns the configurations of a command with a repeatable
// --conf: those given, else the environment's, else def (described by
// defText on stderr); and says on stderr which they are.
func resolveConfs(fs *flagSet, confs []string, defText string, def ...string) ([]string, error) {
	if len(confs) > 0 {
		for _, c := range confs {
			if _, err := parseConf(c); err != nil {
				return nil, err
			}
		}
		reportConf(fs, confs, "--conf", defText)
		return confs, nil
	}
	s, from, err := envConf()
	if err != nil {
		return nil, err
	}
	if from != "" {
		reportConf(fs, []string{s}, from, defText)
		return []string{s}, nil
	}
	reportConf(fs, def, "", defText)
	return def, nil
}

// confLabel names a configuration in output: "default" for "".
func confLabel(conf string) string {
	if strings.TrimSpace(conf) == "" {
		return "default"
	}
	return conf
}

// deviceFlags are --capacity SIZE and --card NAME, of which one may be
// given, and --overhead SIZE, the memory a process holds outside the
// allocator on a card.
type deviceFlags struct {
	capacity sizeFlag
	card     string
	overhead overheadFlag
	fs       *flagSet
	// overheadBytes is the overhead resolve took from the card: 0 unless
	// --card was given.
	overheadBytes uint64
}

// addDeviceFlags defines --capacity, --card and --overhead on fs.
func addDeviceFlags(fs *flagSet, what string) *deviceFlags {
	d := &deviceFlags{capacity: sizeFlag{plan.DefaultCapacity}, fs: fs}
	fs.Var(&d.capacity, "capacity", "simulated device memory `SIZE` (80GiB, 512MiB, bytes): all of it the allocator's"+what)
	fs.StringVar(&d.card, "card", "", "simulate the memory of the card `NAME` (a100-80g, h100-80g, rtx4090-24g, ...), less --overhead")
	addOverheadFlag(fs, &d.overhead)
	return d
}

// addOverheadFlag defines --overhead on fs, as estimate has it.
func addOverheadFlag(fs *flagSet, o *overheadFlag) {
	o.n = estimate.DefaultContext
	fs.Var(o, "overhead", "with --card, per-process memory `SIZE` outside the allocator: the CUDA context, as estimate counts it (default 512MiB)")
}

// overheadBytes returns --overhead, checked.
func overheadBytes(o *overheadFlag) (uint64, error) {
	if o.n > maxOverhead {
		return 0, usageError{fmt.Sprintf("--overhead must be at most 1PiB, got %s", quote(o.arg))}
	}
	return o.n, nil
}

// resolve returns the capacity in bytes that the allocator sees, a label
// for output, and whether the device was given (not the default). A card
// gives the allocator its memory less --overhead, as estimate counts it;
// --capacity is the allocator's whole.
func (d *deviceFlags) resolve() (uint64, string, bool, error) {
	capGiven, cardGiven := flagGiven(d.fs, "capacity"), flagGiven(d.fs, "card")
	over, err := overheadBytes(&d.overhead)
	if err != nil {
		return 0, "", false, err
	}
	switch {
	case capGiven && cardGiven:
		return 0, "", false, usageError{"give --capacity or --card, not both"}
	case flagGiven(d.fs, "overhead") && !cardGiven:
		return 0, "", false, usageError{"--overhead applies with --card (--capacity is the allocator's memory)"}
	case cardGiven:
		c, err := estimate.LookupCard(d.card)
		if err != nil {
			return 0, "", false, usageError{"--card: " + err.Error()}
		}
		if over+plan.Step > c.Memory {
			return 0, "", false, usageError{fmt.Sprintf("--overhead %s leaves the allocator less than 2 MiB of the %s", stats.FormatSize(over), c.Name)}
		}
		d.overheadBytes = over
		n := c.Memory - over
		return n, fmt.Sprintf("%s (%s, less %s overhead: %s)", c.Name, (&sizeFlag{c.Memory}).String(), stats.FormatSize(over), stats.FormatSize(n)), true, nil
	}
	n := d.capacity.n
	if n < plan.Step || n > plan.MaxCapacity {
		return 0, "", false, usageError{fmt.Sprintf("--capacity %s: the simulated device holds from 2 MiB to 8 TiB", d.capacity.String())}
	}
	return n, d.capacity.String(), capGiven, nil
}
