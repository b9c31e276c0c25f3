package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// spinEnv, set to a duration, makes the test binary a busy loop on
// every CPU for that long (at most a minute), then exit 0: the load of
// TestServeClusterSaturated.
const spinEnv = "QUESTRT_TEST_SPIN"

// spin keeps GOMAXPROCS goroutines computing for the duration v.
func spin(v string) int {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > time.Minute {
		fmt.Fprintf(os.Stderr, "%s=%q: want a duration up to 1m\n", spinEnv, v)
		return 3
	}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			x := uint64(1)
			for time.Now().Before(end) {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			if x == 0 {
				fmt.Println(x)
			}
		})
	}
	wg.Wait()
	return 0
}

// TestServeClusterSaturated (issue 27's busy-is-not-dead test): three
// questd processes with questd's default failure-detection timings, the
// serving node's completions attended through a CP 3 grid over all
// three, while busy loops in other processes (two per CPU, bounded)
// keep every CPU of the machine saturated. Every completion must answer
// the pass key; no grid may be lost (every node still hosts the grid,
// the serving node retried no request on a new grid, every node sees
// three members up all along).
func TestServeClusterSaturated(t *testing.T) {
	if testing.Short() || os.Getenv("QUESTRT_LOAD_TESTS") == "" {
		t.Skip("saturates every CPU for up to a minute; QUESTRT_LOAD_TESTS=1 runs it")
	}
	// smallNode without its fast failure-detection timings: questd's
	// defaults are what must hold under load.
	var base []string
	for i := 0; i < len(smallNode); i++ {
		if slices.Contains([]string{"--probe-interval", "--probe-timeout", "--suspicion-mult", "--gossip-interval"}, smallNode[i]) {
			i++
			continue
		}
		base = append(base, smallNode[i])
	}
	with := func(name string, extra ...string) []string {
		args := slices.Clone(base)
		args[slices.Index(args, "--name")+1] = name
		return append(args, extra...)
	}
	p1 := startQuestd(t, with("m1")...)
	p2 := startQuestd(t, with("m2", "--join", p1.ready["gossip"])...)
	p0 := startQuestd(t, with("m0", "--join", p1.ready["gossip"],
		"--model", passkeyModel(t), "--http-addr", "127.0.0.1:0", "--max-running", "4", "--budget-tokens", "512",
		"--serve-layout", "cluster", "--serve-cp", "3", "--serve-capacity-pages", "256", "--prefix-caching=false")...)
	procs := []*questdProc{p0, p1, p2}
	for _, p := range procs {
		waitGauges(t, "three members up", func() bool { return gauge(t, p.ready["metrics"], "questrt_members_up") == 3 })
	}

	// The load: two busy processes per CPU, each ending by itself.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 * runtime.NumCPU() {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), spinEnv+"=45s", "GOMAXPROCS=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	time.Sleep(2 * time.Second) // let the load take the CPUs

	// Members seen up, sampled all along.
	stopWatch := make(chan struct{})
	var watch sync.WaitGroup
	var fewer []string
	var mu sync.Mutex
	watch.Go(func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(200 * time.Millisecond):
			}
			for i, p := range procs {
				if g := gauge(t, p.ready["metrics"], "questrt_members_up"); g != 3 {
					mu.Lock()
					fewer = append(fewer, fmt.Sprintf("m%d saw %v members up at %s", i, g, time.Now().Format("15:04:05.000")))
					mu.Unlock()
				}
			}
		}
	})

	url := "http://" + p0.ready["http"] + "/v1/completions"
	req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": passkeyTestPrompt, "max_tokens": 8, "temperature": 0})
	var reqs sync.WaitGroup
	errs := make(chan error, 6)
	start := time.Now()
	for i := range 6 {
		reqs.Go(func() {
			resp, err := http.Post(url, "application/json", strings.NewReader(string(req)))
			if err != nil {
				errs <- fmt.Errorf("request %d: %v", i, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var out struct {
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 || !strings.HasPrefix(out.Choices[0].Text, "48213") {
				errs <- fmt.Errorf("request %d after %v: %d %s", i, time.Since(start).Round(time.Millisecond), resp.StatusCode, b)
			}
		})
	}
	reqs.Wait()
	close(stopWatch)
	watch.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("6 completions through CP 3 under %d busy processes in %v", 2*runtime.NumCPU(), time.Since(start).Round(time.Millisecond))
	for _, f := range fewer {
		t.Error(f)
	}
	mf := scrape(t, p0.ready["metrics"])
	for _, m := range mf["questrt_request_retries_total"].GetMetric() {
		if v := m.GetCounter().GetValue(); v != 0 {
			t.Errorf("m0 retried %v requests on a new grid (%v): a grid was lost", v, m.GetLabel())
		}
	}
	for i, p := range procs {
		if g := gauge(t, p.ready["metrics"], "questrt_grids", "role", "hosted"); g != 1 {
			t.Errorf("m%d hosts %v grids, want the served grid's rank (the one grid, never lost)", i, g)
		}
	}
}
