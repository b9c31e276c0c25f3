package completion

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// IgnoredFieldsHeader names, in the answer to a completion or chat
// request, the request's fields that the server does not know and
// ignored (comma-separated, in the body's order; "stream_options.x" for
// one inside stream_options). vLLM ignores such fields too, with a
// warning in its log.
const IgnoredFieldsHeader = "X-Questrt-Ignored-Fields"

// maxLoggedIgnored bounds the distinct ignored field names a server logs
// (and remembers): clients may send any names.
const maxLoggedIgnored = 64

// ignoredFields remembers the ignored field names already logged.
type ignoredFields struct {
	mu   sync.Mutex
	seen map[string]bool
}

// fresh returns the names of fields not logged before and marks them,
// up to maxLoggedIgnored names in all.
func (f *ignoredFields) fresh(fields []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, k := range fields {
		if f.seen[k] || len(f.seen) >= maxLoggedIgnored {
			continue
		}
		if f.seen == nil {
			f.seen = map[string]bool{}
		}
		f.seen[k] = true
		out = append(out, k)
	}
	return out
}

// maxIgnoredHeader bounds the header's value in bytes (a body may hold
// any number of unknown fields).
const maxIgnoredHeader = 1024

// fieldName is name as the header and the log show it: as given when it
// is printable ASCII without commas or quotes (every real parameter
// name), else quoted in Go's ASCII form; cut to 64 bytes either way.
func fieldName(name string) string {
	plain := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || c == ',' || c == '"' {
			plain = false
			break
		}
	}
	if !plain {
		name = strconv.QuoteToASCII(name)
	}
	if len(name) > 64 {
		name = name[:61] + "..."
	}
	return name
}

// ignore names a request's ignored fields in its answer's header and
// logs each name the first time the server sees it.
func (s *Server) ignore(w http.ResponseWriter, path string, fields []string) {
	if len(fields) == 0 {
		return
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = fieldName(f)
	}
	var b strings.Builder
	for i, n := range names {
		if b.Len()+len(n)+2 > maxIgnoredHeader {
			fmt.Fprintf(&b, ", and %d more", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n)
	}
	w.Header().Set(IgnoredFieldsHeader, b.String())
	if fresh := s.ignored.fresh(names); len(fresh) > 0 {
		s.log.Warn("request fields ignored (unknown to this server; logged once per name)", "path", path, "fields", fresh)
	}
}
