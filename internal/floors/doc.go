// Package floors holds no code: its test checks the import arrows of
// docs/architecture.md (DESIGN.md section 3) over the whole module. Every
// package sits on a floor; a package imports only its own floor or lower
// ones, and the model, the quality harness and serving reach the runtime
// only through the step seam (package decode) and the kernels' compute
// API. An arrow that breaks the rule may only be listed with the issue
// that removes it (none is listed today); the test fails when a new one
// appears and when a listed one is gone (so that the list only shrinks).
// Another test checks that durable metadata has one home: only
// internal/metastore (and the bbolt checks it opens files with,
// internal/boltcheck) imports bbolt; a third, that docs/architecture.md's
// package table has a row for every package of the module and names no
// other.
package floors
