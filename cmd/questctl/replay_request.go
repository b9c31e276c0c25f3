package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/readlimit"
)

func runReplayRequest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	id, rest := replayRequestID(args)
	return runCommand(ctx, func() (*flag.FlagSet, action) { return replayRequestCommand(id) }, rest, stdout, stderr)
}

// maxAnswerBytes bounds the answer of GET /admin/requests/{id} that
// replay-request reads (a record holds a prompt and an output).
const maxAnswerBytes = 1 << 30

// replayRequestID takes the request id out of args: the first argument
// that is neither a flag nor a flag's value (the command's value flags
// are --addr and --timeout).
func replayRequestID(args []string) (id string, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			rest = append(rest, args[i+1:]...)
			return id, rest
		case strings.HasPrefix(a, "-"):
			rest = append(rest, a)
			name := strings.TrimLeft(a, "-")
			if (name == "addr" || name == "timeout") && i+1 < len(args) {
				i++
				rest = append(rest, args[i])
			}
		case id == "":
			id = a
		default:
			rest = append(rest, a) // a second id: parse refuses it
		}
	}
	return id, rest
}

// replayRequestCommand builds the flags and the action of 'questctl
// replay-request' for request id (see [runCommand]).
func replayRequestCommand(id string) (*flag.FlagSet, action) {
	fs := newFlags("replay-request", `Usage: questctl replay-request --addr HOST:PORT [--json] [--timeout 5m] ID

Re-runs a request a questd completions API served, with dense attention,
to tell a selection miss from a model error. ID is the completion id of
the answer ("id": "cmpl-..."); the server keeps the last
--request-history finished requests (questd's flag, default 64) and
answers POST /admin/requests/ID/replay: it feeds the request's prompt
and the tokens it generated through the model with dense attention
(teacher-forced: each token's logits come from the same prefix the
request had) and compares, per generated token, Quest's most likely
token (as served) with dense attention's.

Prints a table of the generated tokens (index, position, the token,
Quest's and dense attention's choice, whether they agree, dense's logit
margin of its choice over Quest's, dense's log-probability of the token)
and where they first diverge: a token where dense agrees is the model's
choice (an error there is the model's); the first where it does not is
where Quest's page selection changed the output. With --json it prints
the server's answer (completion.ReplayReport) as one JSON line.

--addr is the completions API's address (questd --http-addr), HOST:PORT
or an http:// URL. An unknown or forgotten ID is a one-line error
(exit 1).`)
	addr := fs.String("addr", "", "the completions API of a questd (its --http-addr), HOST:PORT or http://HOST:PORT (required)")
	asJSON := fs.Bool("json", false, "print the replay report as one JSON line")
	tokenFile := fs.String("token-file", "", "`file` holding the server's bearer token (questd --token-file), sent as \"Authorization: Bearer <token>\"")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up when the replay has not finished within this time")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		switch {
		case !flagSet(fs, "addr"):
			return usageError{errors.New("--addr is required: the HOST:PORT of a questd's completions API (see 'questctl replay-request --help')")}
		case id == "":
			return usageError{errors.New("the request ID is required: the completion id of the answer, cmpl-... (see 'questctl replay-request --help')")}
		case *timeout <= 0:
			return usageError{fmt.Errorf("--timeout %q: must be positive", timeout.String())}
		}
		base, err := apiBase(*addr)
		if err != nil {
			return usageError{fmt.Errorf("--addr %q: %v", *addr, err)}
		}
		token, err := readTokenFile(*tokenFile)
		if err != nil {
			return usageError{fmt.Errorf("--token-file %q: %v", *tokenFile, err)}
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		// The replay itself may take minutes; connecting may not.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = (&net.Dialer{Timeout: connectTimeout}).DialContext
		rep, raw, err := fetchReplay(ctx, &http.Client{Transport: withBearer(tr, token)}, base, id)
		if err != nil {
			return err
		}
		if *asJSON {
			_, err := fmt.Fprintf(stdout, "%s\n", strings.TrimSpace(string(raw)))
			return err
		}
		return printReplay(stdout, rep)
	}
}

// apiBase turns --addr into the API's base URL.
func apiBase(addr string) (string, error) {
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		u, err := url.Parse(addr)
		if err != nil || u.Host == "" {
			return "", errors.New("want HOST:PORT or http://HOST:PORT")
		}
		return strings.TrimSuffix(addr, "/"), nil
	}
	if err := checkHostPort(addr); err != nil {
		return "", err
	}
	return "http://" + addr, nil
}

// fetchReplay asks the server for the dense replay of id.
func fetchReplay(ctx context.Context, cl *http.Client, base, id string) (*completion.ReplayReport, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/admin/requests/"+url.PathEscape(id)+"/replay", nil)
	if err != nil {
		return nil, nil, fmt.Errorf("request %s: %w", id, err)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("request %s: %w", id, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(readlimit.Reader(resp.Body, "the answer", maxAnswerBytes))
	if err != nil {
		return nil, nil, fmt.Errorf("request %s: reading the answer: %w", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e completion.ErrorBody
		if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
			return nil, nil, fmt.Errorf("request %s: %s: %s", id, resp.Status, e.Error.Message)
		}
		return nil, nil, fmt.Errorf("request %s: %s: %.200s", id, resp.Status, raw)
	}
	var rep completion.ReplayReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		return nil, nil, fmt.Errorf("request %s: the answer is no replay report: %w", id, err)
	}
	return &rep, raw, nil
}

// printReplay writes the report as a table and a verdict.
func printReplay(w io.Writer, rep *completion.ReplayReport) error {
	s := rep.Settings
	mode := "greedy"
	if !s.Greedy {
		mode = fmt.Sprintf("sampled: temperature %g, top_p %g; compared: the most likely tokens", s.Temperature, s.TopP)
	}
	budget := s.Budget
	if budget == 0 {
		budget = s.BudgetTokens
	}
	fmt.Fprintf(w, "request %s: %d prompt tokens, %d generated (%s)\n", rep.ID, rep.PromptTokens, len(rep.Tokens), mode)
	fmt.Fprintf(w, "selection: %s, budget %d tokens, gqa %s, sink %d, local %d, %d dense layers\n\n", s.Selector, budget, s.GQA, s.Sink, s.Local, s.DenseLayers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "index\tposition\ttoken\tquest\tdense\tagree\tdense margin\tdense logprob")
	for _, t := range rep.Tokens {
		agree := "yes"
		if !t.Agree {
			agree = "NO"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%s\t%.3f\t%.3f\n", t.Index, t.Position, strconv.Quote(t.Text), t.Quest, t.Dense, agree, t.DenseMargin, t.DenseLogprob)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d of %d tokens agree with dense attention\n", rep.Agree, len(rep.Tokens))
	if rep.FirstDivergence < 0 {
		_, err := fmt.Fprintln(w, "no divergence: dense attention makes the same choices, so an error in this output is the model's, not a selection miss")
		return err
	}
	t := rep.Tokens[rep.FirstDivergence]
	_, err := fmt.Fprintf(w, "first divergence at token %d (position %d): Quest chose %d, dense attention %d (dense margin %.3f): a selection miss from there on; the tokens before it are the model's own choices\n",
		t.Index, t.Position, t.Quest, t.Dense, t.DenseMargin)
	return err
}
