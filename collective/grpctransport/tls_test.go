package grpctransport

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/testcert"
)

// mutualTLS returns a tls.Config for mutual TLS between members on
// 127.0.0.1, signed by a fresh CA; another call gives another CA.
func mutualTLS(t *testing.T) *tls.Config {
	t.Helper()
	ca := testcert.NewCA(t, "questrt test CA")
	return ca.MutualTLS(ca.Issue(t, "questrt node"))
}

func tlsGroup(ctx context.Context, n int, tlsFor func(r int) *tls.Config) ([]*Transport, error) {
	base := DefaultConfig()
	return newLocalGroup(ctx, n, base, func(r int, c *Config) { c.TLS = tlsFor(r) })
}

// Members with certificates of one CA talk over mutual TLS.
func TestMutualTLS(t *testing.T) {
	cfg := mutualTLS(t)
	ctx := ctxT(t)
	trs, err := tlsGroup(ctx, 3, func(int) *tls.Config { return cfg })
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, tr := range trs {
			tr.Close()
		}
	}()
	var wg sync.WaitGroup
	for r := range trs {
		wg.Go(func() {
			for p := range trs {
				if err := trs[r].Send(ctx, p, 1, []byte{byte(r)}); err != nil {
					t.Error(err)
				}
			}
			for p := range trs {
				if got, err := trs[r].Recv(ctx, p, 1); err != nil || got[0] != byte(p) {
					t.Errorf("rank %d from %d: %v, %v", r, p, got, err)
				}
			}
		})
	}
	wg.Wait()
}

// A member whose certificate another CA signed never joins.
func TestMutualTLSRefusesStranger(t *testing.T) {
	good, stranger := mutualTLS(t), mutualTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	trs, err := tlsGroup(ctx, 2, func(r int) *tls.Config {
		if r == 1 {
			return stranger
		}
		return good
	})
	if err == nil {
		for _, tr := range trs {
			tr.Close()
		}
		t.Fatal("a group with a stranger's certificate came up")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%v, want DeadlineExceeded", err)
	}
}
