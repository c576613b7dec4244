package httpretry

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestStaleCacheByteBound: 10,000 distinct URLs through a cache of 256 KiB
// keep it within its bound, evict the least recently used first, and keep
// its table, its groups and its list in step.
func TestStaleCacheByteBound(t *testing.T) {
	const maxBytes = 256 << 10
	s := newStaleCache(&staleConfig{maxBytes: maxBytes})
	body := strings.Repeat("b", 1000)
	for i := range 10_000 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://origin.test/item/%d", i), nil)
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Cache-Control": {"max-age=60"}},
			ContentLength: int64(len(body)), Body: io.NopCloser(strings.NewReader(body))}
		resp = s.keep(req, resp)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if s.used > maxBytes {
			t.Fatalf("after %d URLs the cache holds %d bytes, above its bound %d", i+1, s.used, maxBytes)
		}
		if i == 0 {
			// The first URL, never used again, is the first to go.
			defer func() {
				if s.groups[keyOf(t, 0)] != nil {
					t.Error("URL 0, never used again, is still kept")
				}
			}()
		}
	}
	var sum int64
	n := 0
	for e := s.lru.Front(); e != nil; e = e.Next() {
		sum += e.Value.(*staleEntry).size
		n++
	}
	if sum != s.used || n != len(s.groups) {
		t.Errorf("list of %d entries sums %d bytes; cache says %d bytes in %d groups", n, sum, s.used, len(s.groups))
	}
	if s.used < maxBytes-2000 {
		t.Errorf("cache holds %d bytes of %d: it evicts more than it must", s.used, maxBytes)
	}
	if s.groups[keyOf(t, 9999)] == nil {
		t.Error("the last URL is not kept")
	}
	t.Logf("%d of 10000 URLs kept, %d bytes of %d", n, s.used, maxBytes)
}

func keyOf(t *testing.T, i int) string {
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://origin.test/item/%d", i), nil)
	ri, ok := (&staleCache{}).requestInfo(req)
	if !ok {
		t.Fatal("requestInfo refused a plain GET")
	}
	return ri.key
}

func TestParseCacheControl(t *testing.T) {
	tests := []struct {
		lines []string
		want  cacheControl
	}{
		{nil, cacheControl{maxAge: -1, staleIfError: -1}},
		{[]string{"max-age=60"}, cacheControl{maxAge: 60, staleIfError: -1}},
		{[]string{"Max-Age=60, STALE-IF-ERROR=30"}, cacheControl{maxAge: 60, staleIfError: 30}},
		{[]string{`max-age="60"`, `stale-if-error="5"`}, cacheControl{maxAge: 60, staleIfError: 5}},
		{[]string{"max-age=60, max-age=0"}, cacheControl{maxAge: 60, staleIfError: -1}},
		{[]string{"max-age=abc"}, cacheControl{maxAge: 0, staleIfError: -1}},
		{[]string{"max-age=-5, stale-if-error=-5"}, cacheControl{maxAge: 0, staleIfError: -1}},
		{[]string{"max-age=99999999999999999999"}, cacheControl{maxAge: maxDelta, staleIfError: -1}},
		{[]string{"no-store"}, cacheControl{noStore: true, maxAge: -1, staleIfError: -1}},
		{[]string{` private="Set-Cookie, X-A" , no-cache="x", public`}, cacheControl{private: true, noCache: true, public: true, maxAge: -1, staleIfError: -1}},
		{[]string{"must-revalidate,proxy-revalidate"}, cacheControl{mustRevalidate: true, proxyRevalidate: true, maxAge: -1, staleIfError: -1}},
		{[]string{`x-ext="a,no-store", max-age=1`}, cacheControl{maxAge: 1, staleIfError: -1}},
		{[]string{`x-ext="a\"no-store", max-age=2`}, cacheControl{maxAge: 2, staleIfError: -1}},
		{[]string{`x="unterminated, no-store`}, cacheControl{maxAge: -1, staleIfError: -1}},
		{[]string{",,, ,no-store,,"}, cacheControl{noStore: true, maxAge: -1, staleIfError: -1}},
		{[]string{"stale-if-error"}, cacheControl{maxAge: -1, staleIfError: -1}},
	}
	for _, tt := range tests {
		h := http.Header{"Cache-Control": tt.lines}
		if got := parseCacheControl(h); got != tt.want {
			t.Errorf("parseCacheControl(%q) = %+v, want %+v", tt.lines, got, tt.want)
		}
	}
}

// FuzzCacheControl: the parser never panics, terminates, keeps its values
// in range, and reads a field the same split over lines at its commas.
func FuzzCacheControl(f *testing.F) {
	for _, s := range []string{"max-age=60, stale-if-error=30", `private="a,b", no-cache`, `x="\"`, "no-store,,", "max-age=99999999999999999999", `a=",`, "=,=,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		cc := parseCacheControl(http.Header{"Cache-Control": {v}})
		if cc.maxAge < -1 || cc.maxAge > maxDelta || cc.staleIfError < -1 || cc.staleIfError > maxDelta {
			t.Fatalf("parseCacheControl(%q) = %+v: out of range", v, cc)
		}
		if strings.Contains(v, `"`) {
			return // a quoted value may hold commas
		}
		split := parseCacheControl(http.Header{"Cache-Control": strings.Split(v, ",")})
		if split != cc {
			t.Fatalf("parseCacheControl(%q) = %+v, but split at its commas %+v", v, cc, split)
		}
	})
}

// TestStaleKeptBodyFollowsWhatWasRead: a response that announces a 1 MiB
// body holds, while its body is read, a copy of what was read (32 KiB
// preallocated, grown by doubling), not 1 MiB from the start: a server that
// announces a large body and stalls costs no more than it sent, for every
// request that reads it. The body kept in the end has exactly its length.
func TestStaleKeptBodyFollowsWhatWasRead(t *testing.T) {
	const length = 1 << 20
	s := newStaleCache(&staleConfig{maxBytes: 4 << 20})
	req, _ := http.NewRequest("GET", "http://origin.test/big", nil)
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Cache-Control": {"max-age=60"}},
		ContentLength: length, Body: io.NopCloser(strings.NewReader(strings.Repeat("b", length)))}
	resp = s.keep(req, resp)
	k := resp.Body.(*body).keep
	if c := cap(k.buf); c > stalePrealloc {
		t.Fatalf("before the body is read its copy holds %d bytes, want at most %d", c, stalePrealloc)
	}
	chunk := make([]byte, 10<<10)
	read := 0
	for read < 100<<10 {
		n, err := resp.Body.Read(chunk)
		if err != nil {
			t.Fatal(err)
		}
		read += n
	}
	if c := cap(k.buf); c > 2*read+stalePrealloc {
		t.Errorf("after %d bytes read the copy holds %d bytes, want it to follow what was read", read, c)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	ri, _ := s.requestInfo(req)
	g := s.groups[ri.key]
	if g == nil || len(g.entries) != 1 {
		t.Fatal("the 1 MiB response is not kept")
	}
	if b := g.entries[0].body; len(b) != length || cap(b) != length {
		t.Errorf("kept body: %d bytes in %d, want %d in exactly that", len(b), cap(b), length)
	}
}
