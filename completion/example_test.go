package completion_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/serveengine"
)

// A daemon serving a checkpoint: the Server is the handler; on a
// signal it drains (bounded), then the HTTP server and the Server
// close.
func ExampleLoad() {
	cfg := completion.DefaultConfig()
	cfg.Engines = serveengine.Engines() // the in-process engine
	cfg.Policy.BudgetTokens = 512
	s, err := completion.Load("/models/passkey-llama-v1", cfg) // model id "passkey-llama-v1"
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	srv := &http.Server{Addr: "127.0.0.1:8000", Handler: s}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt)
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Drain(ctx) // new requests get 503 meanwhile
		srv.Shutdown(ctx)
	}()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
	// curl -N http://127.0.0.1:8000/v1/completions -d '{"model": "passkey-llama-v1",
	//   "prompt": "...", "max_tokens": 8, "stream": true, "quest": {"budget": 256}}'
}
