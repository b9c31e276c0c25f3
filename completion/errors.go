package completion

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// ErrorBody is OpenAI's error object, the body of every error answer.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of an ErrorBody: a message for people, the
// error's type (invalid_request_error, rate_limit_error, server_error,
// timeout_error), the request parameter at fault (null when none) and a
// machine-readable code (null when none).
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// The error types of ErrorDetail.Type.
const (
	typeInvalid   = "invalid_request_error"
	typeRateLimit = "rate_limit_error"
	typeServer    = "server_error"
	typeTimeout   = "timeout_error"
)

// apiError is an error answer: an HTTP status and its body.
type apiError struct {
	status  int
	typ     string
	param   string // "": null
	code    string // "": null
	message string
	// retry, when set, is sent as Retry-After.
	retry time.Duration
}

func (e *apiError) Error() string {
	if e.param != "" {
		return fmt.Sprintf("%d %s (%s): %s", e.status, e.typ, e.param, e.message)
	}
	return fmt.Sprintf("%d %s: %s", e.status, e.typ, e.message)
}

// body returns the error's JSON body.
func (e *apiError) body() ErrorBody {
	b := ErrorBody{Error: ErrorDetail{Message: e.message, Type: e.typ}}
	if e.param != "" {
		p := e.param
		b.Error.Param = &p
	}
	if e.code != "" {
		c := e.code
		b.Error.Code = &c
	}
	return b
}

// badParam is a 400 naming param.
func badParam(param, code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalid, param: param, code: code, message: fmt.Sprintf(format, args...)}
}

// write sends e as the whole answer.
func (e *apiError) write(w http.ResponseWriter) {
	h := w.Header()
	if e.retry > 0 || e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		h.Set("Retry-After", retryAfter(e.retry))
	}
	writeJSON(w, e.status, e.body())
}

// retryAfter is d in whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// writeJSON sends v as a JSON answer with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"encoding the answer failed","type":"server_error","param":null,"code":null}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
