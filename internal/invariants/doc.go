// Package invariants says whether the costly consistency checks run: the
// O(pages) checks of the page lists and the step that production builds
// skip. They run in builds with the invariants or race tag (as pebble's
// internal/invariants does), so that `go test -race` and `go test -tags
// invariants` check every operation of the tests while a normal build
// pays nothing (Enabled is a constant the compiler folds away).
package invariants
