// Package validate checks the deployment files of deploy/ offline: the
// Kubernetes manifests (kubectl kustomize, then a strict decode of every
// object into its k8s.io/api type), the compose file (a strict decode of
// the compose fields used), questd's config files and command lines (run
// through a questd built from this checkout) and the systemd unit
// (systemd-analyze verify). It is a module of its own, so that the main
// module does not depend on k8s.io/api; run it with
//
//	cd deploy/validate && go test ./... -count=1
package validate
