package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/questrt/questrt/cmd/questctl/internal/plots"
	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/readlimit"
)

func runPlot(args []string, stdout, stderr io.Writer) error {
	return runCommand(context.Background(), plotCommand, args, stdout, stderr)
}

// plotCommand builds the flags and the action of
// 'questctl plot' without running it (see [runCommand]).
func plotCommand() (*flag.FlagSet, action) {
	fs := newFlags("plot", `Usage: questctl plot --in FILE.jsonl[,FILE2.jsonl...] --out FILE.png [--kind passkey|attention|auto]

Draws a PNG figure from the JSON lines that 'questctl eval passkey --json',
'questctl bench attention --json' or 'questctl bench collective --json'
print (the same figure as the first two's --plot flag):

  passkey    accuracy vs token budget (log2), a line per (selector,
             length), the dense baseline dashed; beside it attention-mass
             recall per layer (teacher-forced where the lines have it), a
             panel per (length, selector), a line per budget
  attention  time per step vs context length (log-log): dense, the Quest
             step and its score, top-K and attention phases, a panel per
             (batch, budget)
  collective from a size sweep (--min-bytes...), the all-gather's p50 and
             p99 vs size (log-log) and its bus bandwidth vs size; from
             the configurations, the selection exchange's p50 vs ranks
             beside its same-run baseline, a line per (transport, batch)

All files must hold lines of one kind; --kind auto takes it from the first
line. A configuration given twice (two files of one sweep) is drawn from
the later line. Bad input (an empty file, a line that is not a result
line, with its line number) and an --out that cannot be written are
usage errors (exit 2), and no file is written.`)
	in := fs.String("in", "", fmt.Sprintf("comma-separated JSON-lines files, all of one kind (required; each at most %s)", memlimit.Bytes(maxInputFile)))
	out := fs.String("out", "", "PNG file to write, replaced if it exists (required)")
	kindFlag := fs.String("kind", string(plots.KindAuto), "input kind: passkey (eval passkey --json), attention (bench attention --json), collective (bench collective --json) or auto (from the first line)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		switch {
		case *in == "":
			return usageError{errors.New("--in is required: the JSON-lines files to draw (see 'questctl plot --help')")}
		case *out == "":
			return usageError{errors.New("--out is required: the PNG file to write (see 'questctl plot --help')")}
		}
		kind, err := plots.ParseKind(*kindFlag)
		if err != nil {
			return usageError{fmt.Errorf("--kind %s: want passkey, attention, collective or auto", *kindFlag)}
		}
		if err := checkPlotOut("--out", *out); err != nil {
			return err
		}
		d := &plots.Data{Kind: kind}
		for _, name := range strings.Split(*in, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				return usageError{fmt.Errorf("--in %s: an empty file name", *in)}
			}
			f, err := readlimit.Open(name, maxInputFile)
			if err != nil {
				return usageError{fmt.Errorf("--in %s: %w", name, pathErr(err))}
			}
			err = d.Read(readlimit.Reader(f, name, maxInputFile))
			f.Close()
			if err != nil {
				return usageError{fmt.Errorf("--in %s: %w", name, err)}
			}
		}
		fig, err := d.Figure()
		if err != nil {
			return usageError{fmt.Errorf("--in %s: %w", *in, err)}
		}
		if err := writePlot("--out", *out, fig); err != nil {
			return err
		}
		n := len(d.Passkey) + len(d.Attention) + len(d.Collective) + len(d.Sweep)
		fmt.Fprintf(stderr, "wrote %s: %dx%d pixels from %d %s lines\n", *out, fig.Width, fig.Height, n, d.Kind)
		return nil
	}
}

// pathErr drops the path from a *fs.PathError (the message names it).
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// checkPlotOut checks, before a run, that path (the value of flag) names a
// PNG file that can be written: a .png name in an existing directory that
// accepts a new file. It leaves nothing behind.
func checkPlotOut(flag, path string) error {
	if !strings.EqualFold(filepath.Ext(path), ".png") {
		return usageError{fmt.Errorf("%s %s: want a file name ending in .png", flag, path)}
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return usageError{fmt.Errorf("%s %s: is a directory", flag, path)}
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return usageError{fmt.Errorf("%s %s: directory %s: %w", flag, path, dir, pathErr(err))}
	}
	if !st.IsDir() {
		return usageError{fmt.Errorf("%s %s: %s is not a directory", flag, path, dir)}
	}
	f, err := os.CreateTemp(dir, ".questctl-plot-*.png")
	if err != nil {
		return usageError{fmt.Errorf("%s %s: cannot write in %s: %w", flag, path, dir, pathErr(err))}
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// writePlot draws fig and writes it to path through a temporary file in
// the same directory, renamed into place: a failure leaves no file (and
// an existing one as it was).
func writePlot(flag, path string, fig *plots.Figure) error {
	var b bytes.Buffer
	if err := fig.WritePNG(&b); err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".questctl-plot-*.png")
	if err != nil {
		return usageError{fmt.Errorf("%s %s: cannot create it: %w", flag, path, pathErr(err))}
	}
	_, err = f.Write(b.Bytes())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return nil
}

// plotPasskey draws the figure of an eval passkey run's records (the
// --plot flag of eval passkey).
func plotPasskey(path, model string, recs []eval.Record) error {
	for i := range recs {
		recs[i].Model = model
	}
	fig, err := plots.Passkey(recs)
	if err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return writePlot("--plot", path, fig)
}

// plotAttention draws the figure of a bench attention run from the JSON
// lines it printed (the --plot flag of bench attention); a run that
// failed (runErr) draws nothing.
func plotAttention(path string, lines *bytes.Buffer, runErr error) error {
	if runErr != nil || path == "" {
		return runErr
	}
	d := &plots.Data{Kind: plots.KindAttention}
	if err := d.Read(lines); err != nil {
		return fmt.Errorf("--plot %s: the run's lines: %w", path, err)
	}
	fig, err := d.Figure()
	if err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return writePlot("--plot", path, fig)
}
