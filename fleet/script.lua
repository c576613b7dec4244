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
  -- The key's incarnation: its time (µs) when it was created, sent with
  -- every lease, so that retries leased on a key since lost (a restart,
  -- an eviction, an expiry) are not taken off the count of the same slice
  -- on the key that replaced it.
  if get('in') == 0 then set('in', now) end
end

-- registry returns the key of the registry of processes of the host whose
-- key is key: "{Name}/r:" where the host's has "{Name}:", so that no host's
-- key is another's registry (a Name has no braces: the first "}" ends it).
local function registry(key)
  return (string.gsub(key, '}:', '}/r:', 1))
end

local function save(key)
  local args = {}
  for f in pairs(dirty) do
    args[#args + 1] = f
    args[#args + 1] = string.format('%.17g', h[f])
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

local opened -- the host's breaker opened in this call: news for every process (see news)
local function flip(st)
  if st == 1 and get('st') == 0 then set('so', now) end
  if st == 0 and get('rr') > 0 then set('sc', now) end -- with a rate: the close's time
  set('st', st); set('ep', get('ep') + 1)
  if st == 1 then opened = true end
  for i = 0, buckets - 1 do
    if get('on' .. i) ~= -1 then set('on' .. i, -1) end
  end
end

-- news publishes the opening of the breaker of the host whose key is key
-- on the fleet's channel "{Name}/open" (a Name has no braces: the first
-- "}" ends it), as "<epoch> <now> <key>": every process subscribed trips
-- its breaker at once instead of at its next round trip.
local function news(key)
  if not opened then return end
  opened = false
  local tag = string.match(key, '^[^}]*}')
  if tag then redis.call('PUBLISH', tag .. '/open', get('ep') .. ' ' .. string.format('%.17g', now) .. ' ' .. key) end
end

-- The fleet's attempts in flight to the host loaded in h (see the package
-- documentation, The fleet's attempts in flight). Main hash fields: fi
-- their sum over the processes' latest counts, fh the hold (1: no new
-- attempt starts), fs its sequence (one more at each change), ft when the
-- last hold began, fa the server's time of the last success a process
-- reported, fd how long the last hold a success ended lasted (all µs). The registry
-- holds per process <pid>:f its count and :u when it sent it (µs).
-- flight_bound is the sum at which the hold may begin: three times the
-- attempts that R starts in one baseline, at least 8; 0 (no hold) while
-- the rate is cold, the baseline unknown, or the breaker open (its probes
-- must go).
local held -- the hold changed in this call: news for every process
local function flight_bound()
  local R, b = get('rr'), get('rb')
  if R <= 0 or b <= 0 or get('st') == 1 then return 0 end
  return math.max(8, 3 * R * b / 1e6)
end

local function flight_set(on)
  set('fh', on); set('fs', get('fs') + 1); held = true
  if on == 1 then set('ft', now) end
end

-- flight_judge begins or ends the hold after the sum changed; answered:
-- the process that sent the change had successes since its last count.
-- The hold begins when the sum is at the bound and no process has
-- reported a success for four baselines (at least 20 ms), and for twice
-- the last hold a success ended (fd, µs; 0 after three windows in a row
-- near the baseline, counted in fn): near its capacity a host's queue, and the sum, come and go,
-- but its answers do not stop; and a host whose answers ended a hold after
-- D answers, slowly, at least every D, and is not held between their
-- bursts. It ends at a success, when the sum falls below half the bound
-- (the hung attempts timed out), or with the bound (an open breaker).
local function flight_judge(answered)
  if answered then set('fa', now) end
  local fi, B = get('fi'), flight_bound()
  if get('fh') == 1 then
    if answered then set('fd', now - get('ft')) end
    if B == 0 or fi < B / 2 or answered then flight_set(0) end
  elseif B > 0 and fi >= B and now - get('fa') >= math.max(4 * get('rb'), 20000, 2 * get('fd')) then
    flight_set(1)
  end
end

-- flight_news publishes a change of the hold of the host whose key is key
-- on the fleet's channel, as "h <incarnation> <sequence> <hold> <key>".
local function flight_news(key)
  if not held then return end
  held = false
  local tag = string.match(key, '^[^}]*}')
  if tag then
    redis.call('PUBLISH', tag .. '/open', 'h ' .. string.format('%.17g', get('in')) .. ' ' .. get('fs') .. ' ' .. get('fh') .. ' ' .. key)
  end
end

-- The fleet-wide rate of the host loaded in h (see the package
-- documentation, The fleet's rate). Main hash fields: rr the rate R
-- (attempt starts per second, 0 while cold), rk/rq the windows of the
-- last cut and of the last cut for a queue, rh the last healthy rate,
-- rv recovering (an outage window since the last clean one), rc the
-- last window was clean, rw warm (out of slow start), ru R restored
-- after an outage and not cut since, ri/rj the healthy rate before the
-- last incident and the window of its first cut, rs the window R was
-- first set, rg the current window, wx the breaker open when it began,
-- wz the window before was an outage's, wu the window (µs), sc the
-- breaker's last close (µs), rb the last known baseline (µs), rx the
-- last window that refreshed it, qt<i>/qv<i> the baseline's ring (6
-- buckets of 10 windows: the lowest clean window mean of each),
-- wo/wf/wl/wk/wm/wd the current window's successes, drops, latency sum
-- (µs), samples and fastest sample (µs, 0: none reported), and demand
-- (attempts done plus calls waiting or refused), ld the sum of the
-- processes' demands (each at least the floor), ln the processes, lz ld
-- at the window's start, lq the fair floor (R / 4·ln at the window's
-- start), lf the sum of the processes' floors (each its demand, at most
-- lq), ly lf at the window's start. The registry reg holds per process
-- <pid>:g its last window, :d its demand (starts per second, smoothed),
-- :t its last sync (µs).

local function rate_baseline(id)
  local b = 0
  for i = 0, 5 do
    local tag, v = get('qt' .. i), get('qv' .. i)
    if tag > id - 6 and tag <= id and v > 0 and (b == 0 or v < b) then b = v end
  end
  if b > 0 then set('rb', b) else b = get('rb') end
  return b
end

-- rate_close ends the window rg at the first sync of a later one (gen): it
-- learns R from the window's outcomes and latency, updates the baseline,
-- and forgets the processes not heard of for 10 windows. rate_proven
-- returns the most the host has served in the last 6 buckets of 10 windows
-- (0: no evidence): the mean rate of two successive windows (a report late
-- for one window lands in the next), the later one clean and near the
-- baseline; with the window id's own evidence ev (0: none) counted first.
local function rate_proven(id, ev)
  if ev > 0 then
    local i = id % 6
    if get('mt' .. i) ~= id or get('mv' .. i) < ev then set('mt' .. i, id); set('mv' .. i, ev) end
  end
  local m = 0
  for i = 0, 5 do
    local tag, v = get('mt' .. i), get('mv' .. i)
    if tag > id - 6 and tag <= id and v > m then m = v end
  end
  return m
end

-- rate_full records that the host was full in window id (it queued or
-- dropped some attempts) serving seen a second: evidence of its ceiling
-- that replaces more (kept in mp, window cg in mk, in case of an outage).
local function rate_full(id, seen, cg)
  set('mp', rate_proven(id, 0)); set('mk', cg)
  for i = 0, 5 do set('mt' .. i, 0) end
  if seen > 0 then set('mt' .. (id % 6), id); set('mv' .. (id % 6), seen) end
end

-- rate_incident records, at a cut in window cg from R0, the healthy rate
-- before the incident (ri: the last healthy rate, or R0 without one) at
-- the incident's first cut (rj: its window; a cut 60 windows after the
-- last first cut starts a new incident).
local function rate_incident(cg, R0)
  if get('ri') == 0 or cg - get('rj') > 60 then
    local h = get('rh')
    if h <= 0 then h = R0 end
    set('ri', h); set('rj', cg)
  end
end

local function rate_close(reg, gen, win, lmax, rinit, dfloor)
  local cg = get('rg')
  local R = get('rr')
  local o, fl, lsum, lk, dem = get('wo'), get('wf'), get('wl'), get('wk'), get('wd')
  local fast = get('wm')
  local id = math.floor(cg / 10)
  local base = rate_baseline(id)
  local mean = 0
  if lk > 0 then mean = lsum / lk end
  local served = o / win
  local seen = math.max(served, get('rp')) -- the higher of this window's and the last one's
  local R0 = R
  -- Near the baseline: within 1.5x it, or 5% of a window above it (a
  -- queue that short is within the rate's resolution), or the fastest
  -- sample at most the baseline; queueing: above both twice it and 10%
  -- of a window above it, and a queue that stood the whole window: the
  -- fastest sample above 1.5x the baseline and 5% of a window above it
  -- (a few slow samples, from the clients' own delays, raise the mean
  -- but not the fastest; unknown, 0, counts as standing).
  local fastnear = fast > 0 and fast <= base
  local near = fl == 0 and (o > 0 or lk > 0) and (base == 0 or lk == 0 or fastnear or mean <= math.max(1.5 * base, base + 0.05 * win * 1e6, 1000))
  local standing = fast == 0 or fast > math.max(1.5 * base, base + 0.05 * win * 1e6)
  -- What two windows served, at most the rate in force (reports that
  -- come late make one window's count jitter around it).
  local pair = served
  if get('rc') == 1 then pair = (served + get('rp')) / 2 end
  pair = math.min(pair, R)
  local ev = 0
  -- The fleet's breaker open at any time in the window (open at its
  -- close or at its start, wx, or opened in it, so): an outage window
  -- (its probes prove nothing, and what it served in the rest of it is a
  -- part of a window: no evidence of the host's ceiling, no cut); a full
  -- host taken just before was its first window. R restarts after.
  local outage = get('st') == 1 or get('wx') == 1 or get('so') >= cg * win * 1e6
  if near and get('rc') == 1 and not outage then ev = pair end
  -- The ceiling of a raise: what the host has proven it serves near the
  -- baseline (none in the horizon: the last healthy rate) plus a margin
  -- (at least 2 calls a window): 2x (slow start) until warm, then 1/16
  -- while the demand is met, 8% while calls wait. Warm (rw): drops, a
  -- queue, or a window whose demand R met, from the third window with a
  -- rate on (rs: the window R was first set): the first windows' reports
  -- are partial (each process reports at its own sync, and its first
  -- calls went ungated), and a fleet that took one for met demand left
  -- slow start at a fraction of its load, then climbed 8% a window.
  local proven = rate_proven(id, ev)
  if proven <= 0 then proven = get('rh') end
  local binding = dem >= R * win
  if R > 0 and (fl > 0 or (not binding and cg >= get('rs') + 2)) then set('rw', 1) end
  local margin = 1.0625
  if get('rw') ~= 1 then margin = 2 elseif binding then
    -- After an outage (ru: R restored, no cut since), or below 90% of
    -- the healthy rate before an incident (ri, for 60 windows from its
    -- first cut at rj), 25% while calls wait: the backlog goes out at
    -- what the host takes, not at 8% a window from the rate the incident
    -- left (a slowdown's); an overshoot of a quarter for the two windows
    -- its latency takes to show queues half a window.
    local regain = get('ri') > 0 and R < 0.9 * get('ri') and cg - get('rj') <= 60
    if get('ru') == 1 or regain then margin = 1.25 else margin = 1.08 end
  end
  local ceil = 0
  if proven > 0 then ceil = math.max(margin * proven, proven + 2 / win) end
  if R > 0 and outage then
    if get('mk') > 0 and get('mk') >= cg - 2 and get('rv') == 0 then rate_proven(id, get('mp')); set('mk', 0) end
    set('rv', 1); set('rc', 0)
  elseif R <= 0 then
    -- Cold: the demand of the second window that carries any, at least
    -- rinit, then slow start (the first holds only part of the fleet's:
    -- each process reports first a window after its first sync, at its
    -- own phase of the window; r1: that first window was seen).
    if dem > 0 then
      if get('r1') == 1 then R = math.max(rinit, dem / win); set('rc', 1); set('rs', cg) else set('r1', 1) end
    end
  elseif fl > 0 then
    -- Drops: down by their share, at most halving; not again in the
    -- window after a cut, whose outcomes still show the last rate's, nor
    -- in the window after an outage's (wz), whose reports are the
    -- outage's and the release's first calls'.
    local share = fl / (o + fl)
    local after = get('wz') == 1
    if cg > get('rk') + 1 and not after then
      -- ... and, when they are a quarter of the outcomes or more, to 10%
      -- above the rate served, at most halving. (A smaller share is a
      -- host that took most of what came: the rate served, a window's
      -- reports late, is then the rate before the last raise, and a cut
      -- to it undid every raise at the first few drops; live, a provider
      -- whose admission shed 5-15% at the top of its capacity.)
      local small = share < 0.25
      local cap = R
      if not small then cap = 1.1 * seen end
      R = math.max(0.5 * R, math.min(R * (1 - share), cap))
      set('rk', cg); set('ru', 0); rate_incident(cg, R0)
      -- A cut before a window run at a restored rate: the host takes less
      -- than it did; by half, or to the cut's rate for a small share.
      if get('ro') > 0 then
        local h = 0.5 * get('rh')
        if small then h = math.min(get('rh'), R) end
        set('rh', h); set('ro', 0)
      end
    end
    -- An outage: a full host taken just before was its first window.
    if share >= 0.5 and get('mk') == cg - 1 and get('rv') == 0 then rate_proven(id, get('mp')); set('mk', 0) end
    if share >= 0.5 then set('rv', 1) elseif R0 >= 0.5 * get('rh') and not after then rate_full(id, pair, cg) end
    set('rc', 0)
  elseif lk > 0 and base > 0 and standing and not near and mean > math.max(2 * base, base + 0.1 * win * 1e6, 1000) then
    -- The host queues: down to the rate it served (two windows' mean, at most
    -- R) less 3%, and less the share of it that drains its queue (mean -
    -- baseline of waiting) in two windows, at most halving; not again in the
    -- next window, nor in the three after a cut for a queue unless R rose
    -- since (the drained queue still shows in them).
    set('rw', 1)
    if cg > get('rk') + 1 and cg > get('rq') + 3 then
      local drain = math.max(0.5, 1 - (mean - base) / (2 * win * 1e6))
      R = math.max(R * 0.5, math.min(R, 0.97 * drain * pair))
      set('rk', cg); set('rq', cg); set('ru', 0); rate_incident(cg, R0)
      if get('ro') > 0 then set('rh', get('rh') * 0.5); set('ro', 0) end
    end
    if R0 >= 0.5 * get('rh') then rate_full(id, pair, cg) end
    set('rc', 0)
  elseif o > 0 or lk > 0 then
    local restoring = get('rv') == 1 and near
    if restoring then
      -- Restart from the last healthy rate; a cut before a clean window
      -- confirms it halves it (the host takes less than it did).
      if get('rh') > R then R = get('rh'); set('ro', cg) end
      set('ru', 1)
      set('rv', 0)
    elseif near and get('ro') > 0 and cg >= get('ro') + 2 and dem >= 0.5 * R * win then
      set('ro', 0) -- a window run at the restored rate, clean: confirmed
    end
    if near and not restoring and dem >= 0.75 * R * win then
      R = math.max(R + math.sqrt(R), math.min(2 * R, 1.5 * dem / win))
    end
    -- A clean window never leaves the rate above the ceiling: the host
    -- has not shown it serves more (the calls under it go at once).
    if near and not restoring and ceil > 0 then R = math.min(R, ceil) end
    if R > R0 then set('rq', 0) end
    if near and not restoring and served >= 0.5 * R0 and R0 >= 0.5 * get('rh') then set('rh', math.min(served, R0)) end
    set('rc', 1)
  end
  if R > 0 then
    if base > 0 then R = math.min(R, lmax * 1e6 / base) end
    R = math.min(math.max(R, 1 / win), 1e9)
  end
  -- The baseline: the lowest mean of clean windows (no drops, within 2x
  -- of it), over the last 6 buckets; 300 windows without one reset it to
  -- the next window without drops.
  if fl == 0 and lk > 0 then
    local reset = get('rx') > 0 and cg - get('rx') > 300
    if reset then
      for i = 0, 5 do set('qt' .. i, 0) end
    end
    if base == 0 or reset or mean <= math.max(2 * base, 1000) then
      local i = id % 6
      if get('qt' .. i) ~= id or get('qv' .. i) <= 0 or mean < get('qv' .. i) then
        set('qt' .. i, id); set('qv' .. i, mean)
      end
      set('rx', cg)
      if reset then set('rb', mean) end
    end
  end
  set('rr', R); set('rg', gen); set('rp', served); set('wx', get('st'))
  if outage and R > 0 then set('wz', 1) else set('wz', 0) end
  -- Three windows in a row near the baseline: the host answers at its
  -- speed again, and holds come as before (one is not enough: a window's
  -- reports carry the samples of the window before).
  if near then set('fn', get('fn') + 1) else set('fn', 0) end
  if get('fn') >= 3 then set('fd', 0) end
  set('wo', 0); set('wf', 0); set('wl', 0); set('wk', 0); set('wm', 0); set('wd', 0)
  local raw = redis.call('HGETALL', reg)
  local e = {}
  for i = 1, #raw, 2 do e[raw[i]] = raw[i + 1] end
  local sum, n, ds = 0, 0, {}
  for f, v in pairs(e) do
    if string.sub(f, -2) == ':g' then
      local p = string.sub(f, 1, -3)
      if tonumber(v) < gen - 10 then
        redis.call('HDEL', reg, f, p .. ':d', p .. ':t')
      else
        local d = math.max(tonumber(e[p .. ':d']) or 0, dfloor)
        sum = sum + d
        n = n + 1
        ds[n] = d
      end
    end
  end
  set('ld', sum); set('ln', n); set('lz', sum)
  -- The attempts in flight: the sum again, from the processes that sent a
  -- count in the last two windows (one that stopped is forgotten).
  local fsum = 0
  for f, v in pairs(e) do
    if string.sub(f, -2) == ':f' then
      local p = string.sub(f, 1, -3)
      if (tonumber(e[p .. ':u']) or 0) < now - 2 * win * 1e6 then
        redis.call('HDEL', reg, f, p .. ':u')
      else
        fsum = fsum + tonumber(v)
      end
    end
  end
  set('fi', fsum)
  flight_judge(false)
  -- The fair floor of the window: R / 4n for n processes (a larger one
  -- holds more of R for processes that do not use it: the rate served,
  -- and so R, falls).
  local q, fs = 0, 0
  if R > 0 and n > 0 then q = R / (4 * n) end
  for i = 1, n do fs = fs + math.min(ds[i], q) end
  set('lq', q); set('lf', fs); set('ly', fs)
end

-- rate_probed takes a close of the fleet's breaker by a process's probes
-- at now, with the time of the probe that closed it (µs, 0: unknown) and
-- the rate's window win_us, and returns whether the fleet closes. A probe
-- slower than twice the baseline and 5% of a window above it (a window of such samples is
-- not near the baseline) found a host serving at a fraction of its speed
-- (a slowdown, or a queue still draining): for 10 windows from the open
-- (so) the fleet stays open, and the calls wait for a host that serves at
-- its speed again (live, a release at the rate before the outage into a
-- host slowed x5 filled its queue, and what it queued was served after the
-- slowdown for callers who had left). After that it closes, and the rate's
-- rules cut R on the drops or the queue the release meets (R scaled by
-- the probe's speed was tried: a probe's time in a draining queue then
-- set R at a few per second, and the gates refused the backlog as
-- hopeless).
local function rate_probed(probe, win_us)
  local b = get('rb')
  if get('rr') <= 0 or b <= 0 or probe <= math.max(2 * b, b + 0.05 * win_us) then return true end
  return now - get('so') >= 10 * win_us
end

-- rate_share takes one process's report (waiting < 0: it leaves; refused:
-- its calls refused for want of a token since its last report, demand of
-- the process but not of the host's rate; lmin: its fastest latency
-- sample, µs, 0: none) and returns its share of R and
-- R, both per second: its fair floor (its demand, at most R / 4n for n
-- processes), and the rest of R (at least 3/4 of it) in proportion to
-- the demands.
local function rate_share(reg, pid, waiting, ds, df, lsum, lk, gen, win_us, lmax, rinit, refused, lmin)
  local win = win_us / 1e6
  local dfloor = 0.1 / win
  if get('wu') ~= win_us then set('wu', win_us) end
  if get('rg') == 0 then set('rg', gen)
  elseif gen > get('rg') then rate_close(reg, gen, win, lmax, rinit, dfloor) end
  local R = get('rr')
  local q = get('lq')
  local v = redis.call('HMGET', reg, pid .. ':g', pid .. ':d', pid .. ':t')
  local od, ot = tonumber(v[2]), tonumber(v[3])
  local ow = math.max(od or 0, dfloor)
  if waiting < 0 then
    if v[1] then
      set('ld', math.max(0, get('ld') - ow)); set('ln', math.max(0, get('ln') - 1))
      set('lz', math.max(0, get('lz') - ow))
      set('lf', math.max(0, get('lf') - math.min(ow, q))); set('ly', math.max(0, get('ly') - math.min(ow, q)))
      redis.call('HDEL', reg, pid .. ':g', pid .. ':d', pid .. ':t')
    end
    local fv = tonumber(redis.call('HGET', reg, pid .. ':f'))
    if fv then
      set('fi', math.max(0, get('fi') - fv)); redis.call('HDEL', reg, pid .. ':f', pid .. ':u')
      flight_judge(false)
    end
    return 0, R
  end
  set('wo', get('wo') + ds); set('wf', get('wf') + df)
  set('wl', get('wl') + lsum); set('wk', get('wk') + lk)
  if lk > 0 and lmin > 0 and (get('wm') == 0 or lmin < get('wm')) then set('wm', lmin) end
  set('wd', get('wd') + ds + df + waiting)
  local d
  local x = ds + df + waiting + refused
  if od and ot then
    -- Up at once, down smoothed over about 4 windows.
    local el = math.max((now - ot) / 1e6, 0)
    local xr = x / math.max(el, win)
    if xr >= od then d = xr else d = od + (xr - od) * math.min(1, el / (4 * win)) end
  else
    d = x / win
    set('ln', get('ln') + 1)
  end
  local w = math.max(d, dfloor)
  local D, F = get('ld') + w, get('lf') + math.min(w, q)
  if od then D, F = D - ow, F - math.min(ow, q) end
  set('ld', D); set('lf', F)
  redis.call('HSET', reg, pid .. ':g', gen, pid .. ':d', string.format('%.6f', d), pid .. ':t', string.format('%.0f', now))
  redis.call('PEXPIRE', reg, ttl)
  -- The rest shared by the larger of the demand now and at the window's
  -- start (and of the floors): demand that rises during a window (the
  -- processes report one after the other) must not hand out more than R
  -- to those that report first.
  local r = 0
  if R > 0 then
    r = math.min(w, q) + math.max(0, R - math.max(F, get('ly'))) * w / math.max(D, get('lz'), dfloor)
  end
  return r, R
end

local out = {}
if mode == 'f' then
  local a = 14
  for k = 1, #KEYS do
    load(KEYS[k])
    local reg = registry(KEYS[k])
    local pid, n, answers = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    a = a + 3
    local old = tonumber(redis.call('HGET', reg, pid .. ':f')) or 0
    redis.call('HSET', reg, pid .. ':f', n, pid .. ':u', string.format('%.0f', now))
    redis.call('PEXPIRE', reg, ttl)
    set('fi', math.max(0, get('fi') - old + n))
    flight_judge(answers > 0)
    flight_news(KEYS[k])
    save(KEYS[k])
    for _, v in ipairs({get('fh'), get('fs'), get('in')}) do out[#out + 1] = v end
  end
elseif mode == 's' then
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
      local s, inc, n = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
      a = a + 3
      local i = s % slices
      if s <= cur and s > cur - slices and get('bn' .. i) == s and get('in') == inc then
        set('br' .. i, math.max(0, get('br' .. i) - n))
      end
    end
    local lrate, lfleet = 0, 0
    local probe, win = 0, 0 -- the closing probe's time (µs, 0: none) and the rate's window (µs)
    if ARGV[a] == '1' then
      win = tonumber(ARGV[a + 5])
      probe = tonumber(ARGV[a + 12])
      local r, R = rate_share(registry(KEYS[k]), ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 10]), tonumber(ARGV[a + 11]),
        tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), math.floor(now / win), win, tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]),
        tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9]))
      if R > 0 then
        lrate, lfleet = math.max(1, math.floor(r * 1000 + 0.5)), math.max(1, math.floor(R * 1000 + 0.5))
      end
      a = a + 13
    else
      a = a + 1
    end
    if close == 1 and get('st') == 1 and seen == get('ep') then
      -- A close refused: open again, a new epoch (the prober trips at
      -- this reply, as every process that sees it closed).
      if win == 0 or rate_probed(probe, win) then flip(0) else flip(1) end
    end
    -- Without a report, the rate alone: the process scales its share by
    -- its change (R moves when a window closes, at another process's report).
    if lrate == 0 and get('rr') > 0 then lfleet = math.max(1, math.floor(get('rr') * 1000 + 0.5)) end
    -- seen -1: a new host, which has heard of no epoch: its breaker is
    -- closed, and its outcomes are of the current closed epoch.
    if (ds > 0 or df > 0) and get('st') == 0 and (seen == get('ep') or seen == -1) then
      local i = ring_slot('on', 'os', 'of', bcur, buckets)
      set('os' .. i, get('os' .. i) + ds)
      set('of' .. i, get('of' .. i) + df)
      -- After any outcomes, successes too: the failures of a window may
      -- reach Redis before the successes that bring it to min_calls.
      local calls, fails = outcome_window(bcur)
      local bfails = get('of' .. i)
      local bcalls = get('os' .. i) + bfails
      -- With the fleet's rate (Config.Limit), successes are slow news:
      -- they reach the fleet at their processes' next syncs, up to an
      -- interval late, failures at once, so a burst of failures among
      -- calls whose successes are still unsent looks like a majority
      -- (live, the shed answers of a provider's admission at the top of
      -- a release tripped the fleet's breaker every 3-5 s). So "the
      -- bucket alone" is the bucket with the one before it (a bucket's
      -- first reports are no majority of anything), and for the rate's
      -- window (wu) after a close, whose ring holds only what came
      -- since, the window alone judges (its buckets are the release's
      -- first), and its failures must also be at least the ratio of the
      -- calls the rate R sent since the close.
      local wneed, fresh = 0, false
      if get('rr') > 0 then
        local p = (bcur - 1) % buckets
        if get('on' .. p) == bcur - 1 then
          bfails = bfails + get('of' .. p)
          bcalls = bcalls + get('os' .. p) + get('of' .. p)
        end
        local since = now - get('sc')
        if get('sc') > 0 and since < get('wu') then wneed, fresh = fratio * get('rr') * since / 1e6, true end
      end
      -- At or above the ratio, the product's rounding allowed for (as the
      -- breaker does: 7 failures of 25 are at 0.28).
      if (fails > 0 and calls >= min_calls and fails >= fratio * calls * (1 - 1e-12) and fails >= wneed) or
         (not fresh and bfails > 0 and bcalls >= min_calls and bfails >= fratio * bcalls * (1 - 1e-12)) then flip(1) end
    end
    local q, r = budget_window(cur)
    local calls, fails = outcome_window(bcur)
    if get('fh') == 1 then flight_judge(false) end -- an open breaker ends a hold
    news(KEYS[k])
    flight_news(KEYS[k])
    save(KEYS[k])
    for _, v in ipairs({q, r, get('st'), get('ep'), calls, fails, lrate, lfleet}) do
      out[#out + 1] = v
    end
  end
elseif mode == 'l' then
  load(KEYS[1])
  local cur = math.floor(now / slice_us)
  local q, r = budget_window(cur)
  local k = math.min(tonumber(ARGV[14]), math.floor((ratio * q + reserve) * (1 + 1e-12)) - r)
  if get('st') == 1 then k = 0 end
  if k > 0 then
    local i = budget_slot(cur)
    set('br' .. i, get('br' .. i) + k)
    r = r + k
  else
    k = 0
  end
  save(KEYS[1])
  out = {k, cur, (cur + 1) * slice_us - now, q, r, get('st'), get('ep'), get('in')}
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
