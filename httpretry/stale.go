package httpretry

import (
	"container/list"
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"
	"time"
)

// staleHeader is the response header field of a response served from the
// stale cache; see WithStaleCache.
const staleHeader = "Stormguard-Stale"

// Sizes the stale cache charges besides bodies and header fields.
const (
	// entryOverhead is what an entry is charged for its bookkeeping.
	entryOverhead = 256
	// maxVariants bounds the responses kept per method and URL (one per
	// set of Vary-named request fields and credentials); beyond it the
	// oldest goes.
	maxVariants = 8
)

// stalePrealloc is the most of a kept body's Content-Length allocated
// before it is read (bytes).
const stalePrealloc = 32 << 10

// WithStaleCache keeps the last good response of cacheable GET and HEAD
// requests, up to maxBytes in all, and serves it when the transport gives up
// on such a request: stale-if-error (RFC 5861) for a client. The cached
// response is served, instead of the last failure or the error, when the
// transport gives up because the attempts ran out, the retry budget, the
// breaker or the concurrency limiter refused, or the deadline came (the
// give-ups [WithFallback] serves), and when it gives up on a 500, 502, 503 or 504 for any other
// reason; never when the caller canceled. A request the cache can answer
// that finds the host's breaker open as it starts gets the kept response at
// once, without waiting for the breaker's next probe round (its
// Stormguard-Stale says circuit-open;attempts=0); one whose retry meets
// the breaker open (its own failure tripped it) waits for the round within
// its deadline like any request, and gets the kept response if it then
// gives up. A request the cache cannot answer waits
// and gets the fallback, if any, as before.
//
// What is kept: a response with status 200, 203 or 204 to a GET or HEAD
// (the methods are kept apart), by URL (and Host) and by the values of the
// request header fields its Vary names (a field the request lacks matches
// only its absence, not an empty value; up to 8 variants per URL). Never
// kept: a request with a Range, a request or response with Cache-Control
// no-store, a response with
// no-cache, must-revalidate or proxy-revalidate (they forbid serving it
// stale), a Vary of "*", a Set-Cookie. A request carrying credentials
// (Authorization, Proxy-Authorization or Cookie) is neither kept nor served
// unless withCredentials is true; then its response is kept under a
// SHA-256 of its credentials and served only to requests with the same
// credentials, and a response marked private is kept only for such a
// request (a private response to a request without credentials is never
// kept: the cache cannot tell whose it is). A later answer to the same
// request that is not kept (a 404, a no-store, a body larger than the
// bound; not a 206 or a 304, nor a body cut short or closed by the caller
// before its end) drops the kept one; answers decide in the order they
// arrived, not in the order their bodies are read to the end (an earlier
// one read last does not replace a later one, even when the two name
// different Vary fields: a later answer outranks an earlier one it would
// be served for). The request that decides is the one sent: after
// [WithRefreshOn401], the refreshed one with its credentials. Header
// fields are read under any spelling of their key ("authorization" set
// by assigning to the header's map is sent as written, and the server
// reads it as Authorization).
//
// The body is kept as the caller reads it: the response is stored once its
// body has been read to the end (or to its Content-Length) and is no larger
// than the bound; the caller reads it as it comes, with nothing read ahead,
// and a larger body is passed through whole and not kept. A HEAD response,
// or one with an empty body, is kept at once. A response counts its body,
// its header fields, its key and 256 bytes against maxBytes; the least
// recently used responses go first when a new one needs room, and one
// larger than maxBytes is not kept.
//
// How stale it may be: a response is fresh for its max-age (or Expires
// minus Date), counted from its age when received (Age, or now minus Date
// when later; a Date too old for a Duration, about 292 years, makes it the
// oldest there is, never a negative age). It is served up to stale-if-error seconds past that when it
// carried Cache-Control stale-if-error, else up to maxStale past it (0:
// only responses with stale-if-error are served stale; a fresh one always
// is). A request's own stale-if-error lowers the limit for that request.
//
// A served response is a copy: its body the kept bytes, its Request the
// caller's, its header the kept one plus Age (its age in whole seconds)
// and "Stormguard-Stale: " followed by why the transport gave up, as
// [wire.GiveUpHeader] says it, and ";stale=" with how many whole seconds
// past its freshness it is (0 if still fresh), e.g.
// "Stormguard-Stale: circuit-open;attempts=1;retry-after=2;stale=37".
//
// maxBytes must be positive and maxStale not negative. Each transport
// built with the option has a cache of its own. The cache is safe for
// concurrent use, holds a lock only to look up, store and evict, and runs
// no goroutine; a response whose body is being read holds its copy of what
// was read (32 KiB of it preallocated if its Content-Length says it is that
// long, grown as it is read) until it is stored or given up. Off by
// default.
func WithStaleCache(maxBytes int64, maxStale time.Duration, withCredentials bool) Option {
	return option(func(c *config) error {
		if maxBytes <= 0 {
			return invalid("stale cache size %d must be positive", maxBytes)
		}
		if maxStale < 0 {
			return invalid("stale cache max stale %v must not be negative", maxStale)
		}
		c.stale = &staleConfig{maxBytes: maxBytes, maxStale: maxStale, creds: withCredentials}
		return nil
	})
}

// staleConfig is the stale cache's configuration: an Option holds one and
// every transport built with it makes its own cache from it.
type staleConfig struct {
	maxBytes int64
	maxStale time.Duration
	creds    bool
}

// staleCache is a transport's stale cache.
type staleCache struct {
	staleConfig

	mu      sync.Mutex
	used    int64                    // bytes charged, at most maxBytes
	groups  map[string]*staleGroup   // by method and URL
	lru     list.List                // of *staleEntry, most recently used first
	pending map[string][]*staleEntry // by method and URL: responses whose bodies are being read
}

// newStaleCache returns a cache configured by c; nil (no cache) for a nil c.
func newStaleCache(c *staleConfig) *staleCache {
	if c == nil {
		return nil
	}
	return &staleCache{staleConfig: *c, groups: make(map[string]*staleGroup), pending: make(map[string][]*staleEntry)}
}

// staleGroup is the responses kept for one method and URL.
type staleGroup struct {
	key     string
	entries []*staleEntry // oldest first
}

// staleEntry is one kept response.
type staleEntry struct {
	group *staleGroup
	elem  *list.Element
	size  int64
	// superseded (guarded by the cache's mu): while its body was being
	// read, a later answer to the same request came (kept or not): this
	// one is not stored, and does not drop what is kept.
	superseded bool

	cred     [sha256.Size]byte // of the request's credentials; zero if none
	vary     []string          // the field names Vary named, canonical
	varyVals []string          // the request's values of them

	status       int
	statusText   string
	proto        string
	major, minor int
	header       http.Header
	body         []byte
	length       int64 // ContentLength to serve
	uncompressed bool

	received   time.Time     // when the response arrived
	initialAge time.Duration // its age then
	lifetime   time.Duration // its freshness lifetime
	sie        time.Duration // its stale-if-error; -1 if none
}

// reqInfo is what the cache needs of a request.
type reqInfo struct {
	key  string
	cred [sha256.Size]byte
	cc   cacheControl
	h    http.Header // the request's header fields under their canonical keys
}

// requestInfo returns the cache's view of req, and false if the cache may
// neither keep nor serve a response to it.
func (s *staleCache) requestInfo(req *http.Request) (reqInfo, bool) {
	m := req.Method
	if m == "" {
		m = http.MethodGet
	}
	if m != http.MethodGet && m != http.MethodHead {
		return reqInfo{}, false
	}
	h := canonicalHeader(req.Header)
	ri := reqInfo{cc: parseCacheControl(h), h: h}
	if ri.cc.noStore || len(h["Range"]) > 0 {
		return reqInfo{}, false
	}
	if len(h["Authorization"]) > 0 || len(h["Proxy-Authorization"]) > 0 || len(h["Cookie"]) > 0 {
		if !s.creds {
			return reqInfo{}, false
		}
		sum := sha256.New()
		for _, name := range [...]string{"Authorization", "Proxy-Authorization", "Cookie"} {
			for _, v := range h[name] {
				sum.Write([]byte(name))
				sum.Write([]byte{0})
				sum.Write([]byte(v))
				sum.Write([]byte{0})
			}
		}
		sum.Sum(ri.cred[:0])
	}
	u := *req.URL
	u.Fragment, u.RawFragment = "", ""
	ri.key = m + " " + req.Host + " " + u.String()
	return ri, true
}

// fieldValue is a request's value of a Vary-named field: its lines joined
// by ", ", each trimmed; absentField if the request has none (RFC 9111
// 4.1: a field absent from one request matches only its absence, not an
// empty value).
func fieldValue(h http.Header, name string) string {
	vs := h.Values(name)
	if len(vs) == 0 {
		return absentField
	}
	if len(vs) == 1 {
		return strings.TrimSpace(vs[0])
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strings.TrimSpace(v)
	}
	return strings.Join(out, ", ")
}

// absentField is fieldValue's value of a field the request does not have:
// a NUL, which no field value sent over HTTP holds.
const absentField = "\x00"

// matches reports whether e answers a request with credentials cred and
// header h.
func (e *staleEntry) matches(cred [sha256.Size]byte, h http.Header) bool {
	if e.cred != cred {
		return false
	}
	for i, name := range e.vary {
		if fieldValue(h, name) != e.varyVals[i] {
			return false
		}
	}
	return true
}

// varyNames returns the canonical field names resp's Vary lists, and false
// for a Vary of "*".
func varyNames(h http.Header) ([]string, bool) {
	var names []string
	for _, line := range h.Values("Vary") {
		for _, f := range strings.Split(line, ",") {
			f = strings.TrimSpace(f)
			switch {
			case f == "":
			case f == "*":
				return nil, false
			default:
				names = append(names, http.CanonicalHeaderKey(f))
			}
		}
	}
	return names, true
}

// keep is called with every response the transport hands back for a request
// it did not give up on (s may be nil: no cache): it starts keeping resp if it may be kept (and
// returns it with a body that stores it when read to the end), or drops what
// was kept for the request if not.
func (s *staleCache) keep(req *http.Request, resp *http.Response) *http.Response {
	if s == nil {
		return resp
	}
	ri, ok := s.requestInfo(req)
	if !ok {
		return resp
	}
	now := time.Now()
	e := s.entryFor(req, ri, resp, now)
	if e == nil {
		switch code := resp.StatusCode; {
		case code < 200, code == http.StatusPartialContent, code == http.StatusNotModified:
			// Not an answer that replaces the kept one.
		default:
			s.drop(ri.key, ri.cred, ri.h)
		}
		return resp
	}
	if resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0 || req.Method == http.MethodHead {
		if req.Method != http.MethodHead {
			e.length = 0
		}
		s.mu.Lock()
		s.supersedeLocked(ri.key, e.answers(ri))
		s.storeLocked(ri.key, e)
		s.mu.Unlock()
		return resp
	}
	room := s.maxBytes - e.size
	if resp.ContentLength > room {
		s.drop(ri.key, ri.cred, ri.h)
		return resp
	}
	k := &keeper{s: s, key: ri.key, e: e, room: room, length: resp.ContentLength}
	if resp.ContentLength > 0 {
		k.buf = make([]byte, 0, min(resp.ContentLength, stalePrealloc))
	}
	s.mu.Lock()
	s.supersedeLocked(ri.key, e.answers(ri))
	s.pending[ri.key] = append(s.pending[ri.key], e)
	s.mu.Unlock()
	if b, ok := resp.Body.(*body); ok { // the call's contexts end with it
		b.keep = k
	} else {
		resp.Body = &body{ReadCloser: resp.Body, keep: k}
	}
	return resp
}

// entryFor returns the entry resp would be kept as (without its body), or
// nil if it may not be kept.
func (s *staleCache) entryFor(req *http.Request, ri reqInfo, resp *http.Response, now time.Time) *staleEntry {
	switch resp.StatusCode {
	case http.StatusOK, http.StatusNonAuthoritativeInfo, http.StatusNoContent:
	default:
		return nil
	}
	h := canonicalHeader(resp.Header) // a base RoundTripper may set fields under any spelling
	cc := parseCacheControl(h)
	if cc.noStore || cc.noCache || cc.mustRevalidate || cc.proxyRevalidate || len(h["Set-Cookie"]) > 0 {
		return nil
	}
	var zero [sha256.Size]byte
	if cc.private && ri.cred == zero {
		return nil // whose is it? The cache cannot tell.
	}
	vary, ok := varyNames(h)
	if !ok {
		return nil
	}
	e := &staleEntry{
		cred: ri.cred, vary: vary, varyVals: make([]string, len(vary)),
		status: resp.StatusCode, statusText: resp.Status, proto: resp.Proto, major: resp.ProtoMajor, minor: resp.ProtoMinor,
		header: cloneHeader(h), length: resp.ContentLength, uncompressed: resp.Uncompressed,
		received: now, sie: -1,
	}
	size := int64(entryOverhead + len(ri.key))
	for i, name := range vary {
		e.varyVals[i] = fieldValue(ri.h, name)
		size += int64(len(name) + len(e.varyVals[i]))
	}
	for k, vs := range e.header {
		for _, v := range vs {
			size += int64(len(k) + len(v) + 4)
		}
	}
	e.size = size
	// Age when received (RFC 9111 section 4.2.3, without the request's
	// delay): the larger of Age and now minus Date.
	date, hasDate := parseHTTPDate(h.Get("Date"))
	expiresFrom := date // Expires counts from Date, or from now without one
	if !hasDate {
		expiresFrom = now
	}
	if a := deltaSeconds(strings.TrimSpace(h.Get("Age"))); a > 0 {
		e.initialAge = seconds(a)
	}
	if hasDate && now.Sub(date) > e.initialAge {
		e.initialAge = now.Sub(date)
	}
	switch {
	case cc.maxAge >= 0:
		e.lifetime = seconds(cc.maxAge)
	case len(h["Expires"]) > 0:
		if exp, ok := parseHTTPDate(h.Get("Expires")); ok && exp.After(expiresFrom) {
			e.lifetime = exp.Sub(expiresFrom)
		}
	}
	if cc.staleIfError >= 0 {
		e.sie = seconds(cc.staleIfError)
	}
	return e
}

// cloneHeader returns a deep copy of h, never nil.
func cloneHeader(h http.Header) http.Header {
	if h == nil {
		return make(http.Header)
	}
	return h.Clone()
}

// parseHTTPDate parses an HTTP-date.
func parseHTTPDate(v string) (time.Time, bool) {
	if v == "" {
		return time.Time{}, false
	}
	t, err := http.ParseTime(v)
	return t, err == nil
}

// answers returns whether an earlier response p (its body still being
// read) is one that e, the answer to request ri, comes after: p would be
// served for ri (whatever Vary e names), or e and p answer the same
// request as matchesEntry says. The later answer then decides, even when
// the two name different Vary fields.
func (e *staleEntry) answers(ri reqInfo) func(p *staleEntry) bool {
	return func(p *staleEntry) bool { return p.matches(ri.cred, ri.h) || e.matchesEntry(p) }
}

// matchesEntry reports whether e and o answer the same request: the same
// credentials and the same values of the same Vary-named fields.
func (e *staleEntry) matchesEntry(o *staleEntry) bool {
	return o.cred == e.cred && equalStrings(o.vary, e.vary) && equalStrings(o.varyVals, e.varyVals)
}

// supersedeLocked marks the responses of key whose bodies are being read
// and that like says answer the same request as a later answer: the later
// answer decides what is kept. It requires mu held.
func (s *staleCache) supersedeLocked(key string, like func(*staleEntry) bool) {
	for _, p := range s.pending[key] {
		if like(p) {
			p.superseded = true
		}
	}
}

// settle ends the wait of e, a response of key whose body was being read:
// it is stored if keep (and no later answer superseded it); if not kept
// and drop, the response kept for the same request goes (a later answer
// not kept replaces it), unless a later answer came since.
func (s *staleCache) settle(key string, e *staleEntry, keep, drop bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.pending[key]
	for i, p := range ps {
		if p == e {
			ps = append(ps[:i], ps[i+1:]...)
			break
		}
	}
	if len(ps) == 0 {
		delete(s.pending, key)
	} else {
		s.pending[key] = ps
	}
	switch {
	case e.superseded:
	case keep:
		s.storeLocked(key, e)
	case drop:
		s.dropLikeLocked(key, e)
	}
}

// storeLocked keeps e under key, in place of the response it replaces, and
// evicts the least recently used responses while the cache is over its
// bound. It requires mu held.
func (s *staleCache) storeLocked(key string, e *staleEntry) {
	e.size += int64(len(e.body))
	s.dropLikeLocked(key, e)
	if e.size > s.maxBytes {
		return
	}
	g := s.groups[key]
	if g == nil {
		g = &staleGroup{key: key}
	}
	if len(g.entries) >= maxVariants {
		s.removeLocked(g.entries[0])
	}
	s.groups[key] = g // a removal may have emptied it
	e.group = g
	g.entries = append(g.entries, e)
	e.elem = s.lru.PushFront(e)
	s.used += e.size
	for s.used > s.maxBytes {
		s.removeLocked(s.lru.Back().Value.(*staleEntry))
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// removeLocked forgets e. It requires mu held.
func (s *staleCache) removeLocked(e *staleEntry) {
	g := e.group
	for i, x := range g.entries {
		if x == e {
			g.entries = append(g.entries[:i], g.entries[i+1:]...)
			break
		}
	}
	if len(g.entries) == 0 {
		delete(s.groups, g.key)
	}
	s.lru.Remove(e.elem)
	s.used -= e.size
}

// dropLikeLocked forgets the response kept under key for the same request
// as e (credentials, Vary names and values), if any. It requires mu held.
func (s *staleCache) dropLikeLocked(key string, e *staleEntry) {
	g := s.groups[key]
	if g == nil {
		return
	}
	for _, old := range g.entries {
		if old.matchesEntry(e) {
			s.removeLocked(old)
			return
		}
	}
}

// drop forgets the responses kept under key that answer a request with
// credentials cred and header h, and those still being read for it.
func (s *staleCache) drop(key string, cred [sha256.Size]byte, h http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.supersedeLocked(key, func(p *staleEntry) bool { return p.matches(cred, h) })
	g := s.groups[key]
	if g == nil {
		return
	}
	for _, e := range append([]*staleEntry(nil), g.entries...) {
		if e.matches(cred, h) {
			s.removeLocked(e)
		}
	}
}
