package recordcheck

import (
	"net/http"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		name    string
		status  int
		omitted bool
		body    int
		header  http.Header
		ok      bool
	}{
		{"plain", 200, false, 10, http.Header{"A": {"b"}}, true},
		{"status 999", 999, false, 0, nil, true},
		{"status 199", 199, false, 0, nil, false},
		{"status 1000", 1000, false, 0, nil, false},
		{"omitted without a body", 201, true, 0, nil, true},
		{"omitted with a body", 201, true, 1, nil, false},
		{"empty header name", 200, false, 0, http.Header{"": {"v"}}, false},
		{"empty header name, no values", 200, false, 0, http.Header{"": nil}, false},
	} {
		if err := Check(tt.status, tt.omitted, tt.body, tt.header); (err == nil) != tt.ok {
			t.Errorf("%s: Check = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}
