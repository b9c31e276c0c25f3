// Package client is the old import path of questrt's Go client, kept
// compiling for one release: every name forwards to package
// github.com/questrt/questrt/client, where the client now lives.
//
// Deprecated: import github.com/questrt/questrt/client instead.
package client

import (
	"context"

	"google.golang.org/grpc/credentials"

	"github.com/questrt/questrt/client"
)

// DefaultRecoveredAttempts is client.DefaultRecoveredAttempts.
const DefaultRecoveredAttempts = client.DefaultRecoveredAttempts

// The client's types, as aliases.
type (
	Client      = client.Client
	Damaged     = client.Damaged
	Diag        = client.Diag
	Geometry    = client.Geometry
	Item        = client.Item
	NextItems   = client.NextItems
	Options     = client.Options
	Recovered   = client.Recovered
	Sequence    = client.Sequence
	StepOptions = client.StepOptions
	StepResult  = client.StepResult
	Times       = client.Times
)

// Dial is client.Dial.
func Dial(ctx context.Context, addr string, opt Options) (*Client, error) {
	return client.Dial(ctx, addr, opt)
}

// TokenCredentials is client.TokenCredentials.
func TokenCredentials(addr, token string, creds credentials.TransportCredentials) (credentials.PerRPCCredentials, error) {
	return client.TokenCredentials(addr, token, creds)
}
