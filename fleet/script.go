package fleet

import (
	"errors"
	"fmt"
	"strconv"
)

// scriptSource is the one Lua script every Redis round trip of a fleet runs.
// KEYS are hashes, one per destination host, all under the fleet's hash tag.
// ARGV[1] is the mode: "s" (sync: flush counts of every host in KEYS and read
// their fleet windows), "l" (lease: grant retries of KEYS[1]) or "p" (probe:
// ask for a probe round of KEYS[1]). ARGV[2] is the time in microseconds,
// 0 for the server's clock (TIME); ARGV[3..13] are the fleet's settings (see
// settings.args); the rest depends on the mode.
//
// Each hash holds:
//   - t: the latest time seen, so that a server clock that steps back never
//     moves a window back;
//   - bn<i>, bq<i>, br<i>: the budget's ring of slices, slot i holding slice
//     bn<i> (requests bq<i>, retries br<i>);
//   - on<i>, os<i>, of<i>: the breaker's ring of buckets, slot i holding
//     bucket on<i> (successes os<i>, failures of<i>); -1 marks a slot
//     cleared when the fleet's breaker changed state;
//   - st, ep: the fleet's breaker state (0 closed, 1 open) and epoch (the
//     number of state changes);
//   - ps: the probe slot of the last probe round granted while the fleet's
//     breaker is open; a probe interval has ProbeRounds slots, one round
//     each, so that the rounds are spread over it.
//
// A missing field reads as 0. Numbers are written with %.0f: every value is
// an integer below 2^53, which a Lua number holds exactly.
const scriptSource = `
local mode = ARGV[1]
local now = tonumber(ARGV[2])
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local slice_us, slices = tonumber(ARGV[3]), tonumber(ARGV[4])
local ratio, reserve = tonumber(ARGV[5]), tonumber(ARGV[6])
local bucket_us, buckets = tonumber(ARGV[7]), tonumber(ARGV[8])
local fratio, min_calls = tonumber(ARGV[9]), tonumber(ARGV[10])
local ttl = tonumber(ARGV[11])
local probe_us, rounds = tonumber(ARGV[12]), tonumber(ARGV[13])

local h, dirty
local function get(f) return h[f] or 0 end
local function set(f, v) h[f] = v; dirty[f] = true end

local function load(key)
  h, dirty = {}, {}
  local raw = redis.call('HGETALL', key)
  for i = 1, #raw, 2 do h[raw[i]] = tonumber(raw[i + 1]) end
  if get('t') > now then now = get('t') else set('t', now) end
end

local function save(key)
  local args = {}
  for f in pairs(dirty) do
    args[#args + 1] = f
    args[#args + 1] = string.format('%.0f', h[f])
  end
  if #args > 0 then redis.call('HSET', key, unpack(args)) end
  redis.call('PEXPIRE', key, ttl)
end

-- ring_sum returns the sums of fields a<i> and b<i> over the slots i of a
-- ring of n whose tag t<i> lies in the window (cur - n, cur].
local function ring_sum(t, a, b, cur, n)
  local x, y = 0, 0
  for s = cur - n + 1, cur do
    local i = s % n
    if get(t .. i) == s then
      x = x + get(a .. i)
      y = y + get(b .. i)
    end
  end
  return x, y
end

-- ring_slot returns the slot of cur in a ring of n, emptied first if it
-- held an older slice.
local function ring_slot(t, a, b, cur, n)
  local i = cur % n
  if get(t .. i) ~= cur then
    set(t .. i, cur); set(a .. i, 0); set(b .. i, 0)
  end
  return i
end

local function budget_window(cur) return ring_sum('bn', 'bq', 'br', cur, slices) end
local function budget_slot(cur) return ring_slot('bn', 'bq', 'br', cur, slices) end
local function outcome_window(cur)
  local succ, fails = ring_sum('on', 'os', 'of', cur, buckets)
  return succ + fails, fails
end

local function flip(st)
  set('st', st); set('ep', get('ep') + 1)
  for i = 0, buckets - 1 do
    if get('on' .. i) ~= -1 then set('on' .. i, -1) end
  end
end

-- limit_share runs the fleet-wide limit of the host loaded in h for one
-- process's sync (see the package documentation, The fleet's limit). The
-- first sync of a window (gen, one per sync interval) updates the limit
-- from the last window's outcomes and forgets the processes not heard of
-- for more than 10 windows. The process's report (attempts in flight
-- inf, demand dem: in flight plus waiting; dem < 0: it leaves) replaces
-- its last one in the registry reg (fields <pid>:g window, :h slots held,
-- :r last grant, :d demand, :c credit, :b refused); its grant is its share of the
-- limit, within the slots the others hold. Held slots are the most of the
-- grant, the last grant and the attempts in flight, so that the slots a
-- process may still use are never granted to another. Main hash fields:
-- lm limit, ls slow-start threshold, lg window, lo/lf outcomes of the
-- window, lu window used (demand >= limit/2), lc last window clean, lh
-- slots held, ld demand, ln processes, lq processes refused their share
-- (registry :b). Returns the grant and the limit.
local function limit_share(reg, pid, inf, dem, ds, df, gen, lmax, linit)
  local L = get('lm')
  if L <= 0 then
    L = math.min(linit, lmax)
    set('lm', L); set('ls', lmax); set('lg', gen)
  end
  if gen > get('lg') then
    local o, fl = get('lo'), get('lf')
    if fl > 0 then
      L = math.max(1, math.floor(L * math.max(0.5, 1 - fl / (o + fl))))
      if get('lc') == 1 then set('ls', L) end
      set('lc', 0)
    elseif o > 0 then
      if get('lu') == 1 then
        if L < get('ls') then L = math.min(2 * L, get('ls'))
        else L = L + math.max(1, math.floor(math.sqrt(L))) end
        L = math.min(L, lmax)
      end
      set('lc', 1)
    end
    set('lm', L); set('lg', gen); set('lo', 0); set('lf', 0); set('lu', 0)
    local raw = redis.call('HGETALL', reg)
    local e = {}
    for i = 1, #raw, 2 do e[raw[i]] = raw[i + 1] end
    for f, v in pairs(e) do
      if string.sub(f, -2) == ':g' and tonumber(v) < gen - 10 then
        local p = string.sub(f, 1, -3)
        set('lh', math.max(0, get('lh') - (tonumber(e[p .. ':h']) or 0)))
        set('ld', math.max(0, get('ld') - (tonumber(e[p .. ':d']) or 0)))
        set('ln', math.max(0, get('ln') - 1))
        set('lq', math.max(0, get('lq') - (tonumber(e[p .. ':b']) or 0)))
        redis.call('HDEL', reg, f, p .. ':h', p .. ':r', p .. ':d', p .. ':c', p .. ':b')
      end
    end
  end
  set('lo', get('lo') + ds); set('lf', get('lf') + df)
  local v = redis.call('HMGET', reg, pid .. ':g', pid .. ':h', pid .. ':r', pid .. ':d', pid .. ':c', pid .. ':b')
  local eh, er = tonumber(v[2]) or 0, tonumber(v[3]) or 0
  local ed, ec, eb = tonumber(v[4]) or 0, tonumber(v[5]) or 0, tonumber(v[6]) or 0
  local others = get('lh') - eh
  if dem < 0 then
    if v[1] then
      set('lh', math.max(0, others)); set('ld', math.max(0, get('ld') - ed)); set('ln', math.max(0, get('ln') - 1))
      set('lq', math.max(0, get('lq') - eb))
      redis.call('HDEL', reg, pid .. ':g', pid .. ':h', pid .. ':r', pid .. ':d', pid .. ':c', pid .. ':b')
    end
    return 0, L
  end
  if not v[1] then set('ln', get('ln') + 1) end
  local D, N = get('ld') - ed + dem, math.max(get('ln'), 1)
  local share
  if D <= L then share = dem + (L - D) / N else share = L * dem / D end
  local want = share + ec
  -- Slots go first to the processes that were refused their share for
  -- want of free slots (lq of them, flag b) and hold none since: the
  -- others leave one free slot for each, so that a freed slot goes to
  -- the next such process to sync, not back to the one that freed it.
  local free = L - others
  if eb == 0 or eh > 0 then free = free - (get('lq') - eb) end
  local g = math.max(0, math.min(math.floor(want), free))
  local b = 0
  if g < math.floor(want) then b = 1 end
  set('lq', math.max(0, get('lq') + b - eb))
  ec = math.min(math.max(want - g, 0), 1)
  local held = math.max(g, er, inf)
  set('lh', others + held); set('ld', D)
  if D >= L / 2 then set('lu', 1) end
  redis.call('HSET', reg, pid .. ':g', gen, pid .. ':h', held, pid .. ':r', g, pid .. ':d', dem,
    pid .. ':c', string.format('%.6f', ec), pid .. ':b', b)
  redis.call('PEXPIRE', reg, ttl)
  return g, L
end

local out = {}
if mode == 's' then
  local a = 14
  for k = 1, #KEYS do
    load(KEYS[k])
    local cur, bcur = math.floor(now / slice_us), math.floor(now / bucket_us)
    local dq, ds, df = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local seen, close, nret = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
    a = a + 6
    if dq > 0 then
      local i = budget_slot(cur)
      set('bq' .. i, get('bq' .. i) + dq)
    end
    for j = 1, nret do
      local s, n = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
      a = a + 2
      local i = s % slices
      if s <= cur and s > cur - slices and get('bn' .. i) == s then
        set('br' .. i, math.max(0, get('br' .. i) - n))
      end
    end
    local lgrant, llimit = 0, 0
    if ARGV[a] == '1' then
      local win = tonumber(ARGV[a + 4])
      lgrant, llimit = limit_share(KEYS[k] .. ':l', ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
        ds, df, math.floor(now / win), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]))
      a = a + 7
    else
      a = a + 1
    end
    if close == 1 and get('st') == 1 and seen == get('ep') then flip(0) end
    if (ds > 0 or df > 0) and get('st') == 0 and seen == get('ep') then
      local i = ring_slot('on', 'os', 'of', bcur, buckets)
      set('os' .. i, get('os' .. i) + ds)
      set('of' .. i, get('of' .. i) + df)
      if df > 0 then
        local calls, fails = outcome_window(bcur)
        local bcalls = get('os' .. i) + get('of' .. i)
        if (calls >= min_calls and fails >= fratio * calls) or
           (bcalls >= min_calls and get('of' .. i) >= fratio * bcalls) then flip(1) end
      end
    end
    local q, r = budget_window(cur)
    local calls, fails = outcome_window(bcur)
    save(KEYS[k])
    for _, v in ipairs({q, r, get('st'), get('ep'), calls, fails, lgrant, llimit}) do
      out[#out + 1] = v
    end
  end
elseif mode == 'l' then
  load(KEYS[1])
  local cur = math.floor(now / slice_us)
  local q, r = budget_window(cur)
  local k = math.min(tonumber(ARGV[14]), math.floor(ratio * q + reserve) - r)
  if get('st') == 1 then k = 0 end
  if k > 0 then
    local i = budget_slot(cur)
    set('br' .. i, get('br' .. i) + k)
    r = r + k
  else
    k = 0
  end
  save(KEYS[1])
  out = {k, cur, (cur + 1) * slice_us - now, q, r, get('st'), get('ep')}
elseif mode == 'p' then
  load(KEYS[1])
  local seen = tonumber(ARGV[14])
  local granted = 0
  if get('st') == 1 then
    local slot = math.floor(now / math.max(math.floor(probe_us / rounds), 1))
    if get('ps') ~= slot then
      set('ps', slot)
      granted = 1
    end
  elseif seen == get('ep') then
    granted = 1
  end
  save(KEYS[1])
  out = {granted, get('st'), get('ep')}
else
  return redis.error_reply('stormguard fleet: unknown mode ' .. tostring(mode))
end
table.insert(out, 1, now)
return out
`

// errBadReply is wrapped by every error a decoder returns for a reply that
// is not what the script sends.
var errBadReply = errors.New("fleet: malformed script reply")

func badReply(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errBadReply}, args...)...)
}

// Fleet breaker states in the script.
const (
	fleetClosed = 0
	fleetOpen   = 1
)

// hostWindow is what a sync reads back for one host: the fleet's budget and
// breaker windows after this process's counts were added.
type hostWindow struct {
	requests, retries int64
	state, epoch      int64
	calls, failures   int64
	grant, limit      int64 // this process's share and the fleet's limit (0, 0 without a limit)
}

// syncReply is the decoded reply of a sync.
type syncReply struct {
	now   int64 // the server's time, in microseconds
	hosts []hostWindow
}

// leaseReply is the decoded reply of a lease request.
type leaseReply struct {
	now               int64
	granted           int64 // retries granted, counted in slice
	slice             int64
	left              int64 // microseconds until slice ends
	requests, retries int64 // the window after the grant
	state, epoch      int64
}

// probeReply is the decoded reply of a probe request.
type probeReply struct {
	now          int64
	granted      bool
	state, epoch int64
}

func checkState(st, ep int64) error {
	if st != fleetClosed && st != fleetOpen {
		return badReply("breaker state %d", st)
	}
	if ep < 0 {
		return badReply("epoch %d", ep)
	}
	return nil
}

func checkCounts(vs ...int64) error {
	for _, v := range vs {
		if v < 0 {
			return badReply("negative count %d", v)
		}
	}
	return nil
}

// decodeSync decodes the reply of a sync of n hosts.
func decodeSync(v []int64, n int) (syncReply, error) {
	if len(v) != 1+8*n {
		return syncReply{}, badReply("sync of %d hosts: %d values, want %d", n, len(v), 1+8*n)
	}
	r := syncReply{now: v[0], hosts: make([]hostWindow, n)}
	for i := range r.hosts {
		x := v[1+8*i : 9+8*i]
		w := hostWindow{requests: x[0], retries: x[1], state: x[2], epoch: x[3], calls: x[4], failures: x[5],
			grant: x[6], limit: x[7]}
		if err := checkCounts(w.requests, w.retries, w.calls, w.failures, w.grant, w.limit); err != nil {
			return syncReply{}, err
		}
		if err := checkState(w.state, w.epoch); err != nil {
			return syncReply{}, err
		}
		if w.failures > w.calls {
			return syncReply{}, badReply("%d failures in %d calls", w.failures, w.calls)
		}
		r.hosts[i] = w
	}
	return r, nil
}

// decodeLease decodes the reply of a lease request for want retries.
func decodeLease(v []int64, want int64) (leaseReply, error) {
	if len(v) != 8 {
		return leaseReply{}, badReply("lease: %d values, want 8", len(v))
	}
	r := leaseReply{now: v[0], granted: v[1], slice: v[2], left: v[3], requests: v[4], retries: v[5], state: v[6], epoch: v[7]}
	if err := checkCounts(r.granted, r.slice, r.requests, r.retries); err != nil {
		return leaseReply{}, err
	}
	if r.granted > want {
		return leaseReply{}, badReply("lease: %d retries granted, %d asked", r.granted, want)
	}
	if r.left <= 0 {
		return leaseReply{}, badReply("lease: %dµs left in the slice", r.left)
	}
	return r, checkState(r.state, r.epoch)
}

// decodeProbe decodes the reply of a probe request.
func decodeProbe(v []int64) (probeReply, error) {
	if len(v) != 4 {
		return probeReply{}, badReply("probe: %d values, want 4", len(v))
	}
	if v[1] != 0 && v[1] != 1 {
		return probeReply{}, badReply("probe: granted %d", v[1])
	}
	r := probeReply{now: v[0], granted: v[1] == 1, state: v[2], epoch: v[3]}
	return r, checkState(r.state, r.epoch)
}

// settings are the fleet's numbers the script needs, fixed at New.
type settings struct {
	sliceUS  int64   // budget slice
	slices   int64   // budget slices per window
	ratio    float64 // retries per request (0 for none)
	reserve  float64 // the floor: retries per window
	bucketUS int64   // breaker bucket
	buckets  int64   // breaker buckets per window
	fratio   float64 // failure ratio that opens the breaker
	minCalls int64   // calls the fleet's window needs before it may open
	ttlMS    int64   // expiry of an idle host's hash
	probeUS  int64   // the probe interval
	rounds   int64   // probe rounds per probe interval, fleet-wide

	// The fleet-wide limit (Config.Limit): limitMax is 0 without one.
	limitWindowUS, limitMax, limitInit int64
}

func ftoa(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
func itoa(x int64) string   { return strconv.FormatInt(x, 10) }

// args returns ARGV[1..13] for mode at time now (0: the server's clock).
func (s *settings) args(mode string, now int64) []string {
	return []string{mode, itoa(now),
		itoa(s.sliceUS), itoa(s.slices), ftoa(s.ratio), ftoa(s.reserve),
		itoa(s.bucketUS), itoa(s.buckets), ftoa(s.fratio), itoa(s.minCalls),
		itoa(s.ttlMS), itoa(s.probeUS), itoa(s.rounds)}
}

// returned is a number of leased retries given back unused, and the slice
// they were counted in.
type returned struct{ slice, n int64 }

// syncHost is one host's part of a sync.
type syncHost struct {
	requests, successes, failures uint64
	seen                          int64
	close                         bool
	returns                       []returned
	limit                         *limitReport // nil: the host has no limiter
}

// limitReport is a process's report to the fleet's limit of a host: its
// id, its attempts in flight and its demand (in flight plus waiting), and
// the fleet's settings of the limit (window in microseconds, Max, the
// initial limit).
type limitReport struct {
	pid                      string
	inFlight, demand         int64
	windowUS, max, initLimit int64
}

// appendSync appends a host's ARGV of a sync to args.
func appendSync(args []string, h syncHost) []string {
	cl := "0"
	if h.close {
		cl = "1"
	}
	args = append(args, strconv.FormatUint(h.requests, 10), strconv.FormatUint(h.successes, 10),
		strconv.FormatUint(h.failures, 10), itoa(h.seen), cl, itoa(int64(len(h.returns))))
	for _, r := range h.returns {
		args = append(args, itoa(r.slice), itoa(r.n))
	}
	if l := h.limit; l != nil {
		return append(args, "1", l.pid, itoa(l.inFlight), itoa(l.demand), itoa(l.windowUS), itoa(l.max), itoa(l.initLimit))
	}
	return append(args, "0")
}
