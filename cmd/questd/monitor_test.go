package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestServeMonitor: questd --monitor-rate 1 replays every sampled
// (step, layer, KV head) of the completions API and exports page recall,
// mass recall and output error histograms by layer (the sparse layers
// only: --dense-layers 1 of passkey-llama-v1's) and the sample counts on
// /metrics; without --monitor-rate none of them is there.
func TestServeMonitor(t *testing.T) {
	v1 := passkeyModel(t)
	for _, rate := range []string{"0", "1"} {
		args := append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--budget-tokens", "64", "--monitor-rate", rate)
		cfg, err := load(t, nil, args...)
		if err != nil {
			t.Fatal(err)
		}
		ready, _, stop := runServe(t, cfg)
		prompt := strings.Repeat("The grass is green. The sky is blue. The sun is yellow. Here we go. ", 6)
		req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": prompt, "max_tokens": 6, "temperature": 0})
		resp, err := http.Post("http://"+ready["http"]+"/v1/completions", "application/json", strings.NewReader(string(req)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %s", resp.Status)
		}
		var body string
		replayed := regexp.MustCompile(`questrt_monitor_samples_total\{outcome="replayed"\} (\d+)`)
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, body = httpGet(t, "http://"+ready["metrics"]+"/metrics")
			m := replayed.FindStringSubmatch(body)
			// 5 decode steps x 5 sparse layers x 2 KV heads.
			if rate == "0" || (m != nil && m[1] == strconv.Itoa(5*5*2)) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if rate == "0" {
			if strings.Contains(body, "questrt_monitor_") {
				t.Errorf("--monitor-rate 0 exports monitor metrics")
			}
		} else {
			for _, want := range []string{
				`questrt_monitor_samples_total{outcome="replayed"} 50`,
				`questrt_monitor_samples_total{outcome="dropped"} 0`,
				`questrt_monitor_page_recall_count{layer="1"} 10`,
				`questrt_monitor_mass_recall_count{layer="5"} 10`,
				`questrt_monitor_output_error_count{layer="3"} 10`,
				`questrt_monitor_mass_recall_bucket{layer="2",le="1"} 10`,
			} {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
			if strings.Contains(body, `questrt_monitor_page_recall_count{layer="0"}`) {
				t.Errorf("the dense layer 0 was sampled")
			}
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMonitorFlags: --monitor-rate takes a fraction 0..1, --monitor-queue
// at least 1 and --request-history no negative count, each refusal
// naming its flag.
func TestMonitorFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--monitor-rate", "1.5"}, "--monitor-rate"},
		{[]string{"--monitor-rate", "-0.1"}, "--monitor-rate"},
		{[]string{"--monitor-rate", "x"}, "--monitor-rate"},
		{[]string{"--monitor-queue", "0"}, "--monitor-queue"},
		{[]string{"--request-history", "-1"}, "--request-history"},
	} {
		_, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
	cfg, err := load(t, nil, "--insecure", "--monitor-rate", "0.01", "--request-history", "5")
	if err != nil {
		t.Fatal(err)
	}
	if sc := cfg.serveConfig(nil); sc.Monitor.Rate != 0.01 || sc.Monitor.Queue != 64 || sc.History != 5 {
		t.Errorf("serve config: monitor %+v, history %d", sc.Monitor, sc.History)
	}
}
