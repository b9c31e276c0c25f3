package main

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// requireToken wraps the completions API's handler so that, with
// --token-file, every request must carry "Authorization: Bearer <token>"
// (what the OpenAI clients send as their API key), as the gRPC client API
// must: the API's requests, the model list and the /admin endpoints with
// their prompts and outputs alike. A request without it, or with another
// token, gets 401 in OpenAI's error shape and reaches nothing. An empty
// token (no --token-file) returns h unchanged.
func requireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), want) != 1 {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("WWW-Authenticate", `Bearer realm="questd"`)
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"message":"missing or wrong API key: this server (questd --token-file) wants \"Authorization: Bearer <token>\"","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}` + "\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}
