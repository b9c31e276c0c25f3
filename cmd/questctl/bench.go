package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("want a benchmark name: attention, collective, decode, offload, selection or serve")}
	}
	switch args[0] {
	case "attention":
		return runBenchAttention(ctx, args[1:], stdout, stderr)
	case "collective":
		return runBenchCollective(ctx, args[1:], stdout, stderr)
	case "decode":
		return runBenchDecode(ctx, args[1:], stdout, stderr)
	case "offload":
		return runBenchOffload(ctx, args[1:], stdout, stderr)
	case "selection":
		return runBenchSelection(ctx, args[1:], stdout, stderr)
	case "serve":
		return runBenchServe(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, "Usage: questctl bench attention|collective|decode|offload|selection|serve [flags]\n\nRun 'questctl bench <name> --help' for its flags.\n")
		return nil
	}
	return usageError{fmt.Errorf("unknown benchmark %q (want attention, collective, decode, offload, selection or serve)", args[0])}
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}
