package serveload

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// NewTransport returns an HTTP transport for Run's client: idle
// connections for MaxConcurrency streams and more, no compression. The
// caller closes its idle connections when done.
func NewTransport() *http.Transport {
	return &http.Transport{MaxIdleConns: 4 * MaxConcurrency, MaxIdleConnsPerHost: 2 * MaxConcurrency, DisableCompression: true}
}

// Run runs every level of c (valid) against the completions API at
// c.Addr through hc (whose transport adds the API's credentials, if
// any), calling emit with each result as soon as it is measured.
// Progress lines go to progress, which must be safe for concurrent use:
// the requests of a level report from their own goroutines. A c.Model
// that the server does not list is an error wrapping ErrModelNotListed.
func Run(ctx context.Context, c Config, hc *http.Client, progress io.Writer, emit func(Result) error) error {
	cl := &client{base: "http://" + c.Addr, http: hc, cfg: c, errOut: progress}
	model, err := cl.modelID(ctx)
	if err != nil {
		return err
	}
	cl.cfg.Model = model
	most := 0
	for _, n := range c.Concurrency {
		most = max(most, c.levelRequests(n))
	}
	prompts, err := passkeyPrompts(c.Seed, 0, most, c.PromptLen)
	if err != nil {
		return err
	}
	var bg prompt
	if c.BackgroundLen > 0 {
		ps, err := passkeyPrompts(c.Seed, 1<<40, 1, c.BackgroundLen)
		if err != nil {
			return err
		}
		bg = ps[0]
	}
	warm := prompts[0]
	if c.SharedPrefix > 0 {
		// A prompt of its own: the warm-up caches no level's document.
		ps, err := passkeyPrompts(c.Seed, 1<<41, 1, c.PromptLen)
		if err != nil {
			return err
		}
		warm = ps[0]
		fmt.Fprintf(progress, "bench serve: %s, model %s: shared prefixes of %d bytes (%d per level), max_tokens %d, selectors %s, concurrency %v\n",
			cl.base, model, c.SharedPrefix, c.PrefixGroups, c.MaxTokens, strings.Join(c.Selectors, ","), c.Concurrency)
	} else {
		fmt.Fprintf(progress, "bench serve: %s, model %s: prompts of %d bytes, max_tokens %d, selectors %s, concurrency %v\n",
			cl.base, model, c.PromptLen, c.MaxTokens, strings.Join(c.Selectors, ","), c.Concurrency)
	}
	// Warm-up, selector by selector, before any level: the server's cold
	// start (the first prefill, its pools growing) lands on no level.
	for _, sel := range c.Selectors {
		for i := range c.Warmup {
			fmt.Fprintf(progress, "bench serve: warm-up %d of %d (%s)\n", i+1, c.Warmup, sel)
			if w := cl.stream(ctx, cl.body(warm, sel, 1), "", nil); w.err != nil {
				return fmt.Errorf("warm-up request (%s): %v", sel, w.err)
			}
		}
	}
	level := uint64(0)
	for _, n := range c.Concurrency {
		for _, sel := range c.Selectors {
			ps := prompts[:c.levelRequests(n)]
			if c.SharedPrefix > 0 {
				// New documents each level: its first request of each
				// misses whatever the levels before cached.
				level++
				if ps, err = sharedPrompts(c.Seed, level<<32, c.levelRequests(n), c.PrefixGroups, c.SharedPrefix); err != nil {
					return err
				}
			}
			alone, err := cl.level(ctx, sel, n, ps, nil)
			if err != nil {
				return err
			}
			if err := emit(alone); err != nil {
				return err
			}
			if c.BackgroundLen == 0 {
				continue
			}
			r, err := cl.level(ctx, sel, n, ps, &bg)
			if err != nil {
				return err
			}
			if alone.TTFTP50MS > 0 {
				r.TTFTVsAlone = r.TTFTDuringPrefillP50MS / alone.TTFTP50MS
			}
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
}
