-- Token bucket (seed 002 §3.4, made exact), as sluice_limits::TokenBucket. KEYS[1]: a hash
-- {t = whole tokens, c = credit toward the next token in units of 1/period token,
-- l = time of the last update}. A missing key is a full bucket updated at `now`.
local key = KEYS[1]
local st = redis.call('HMGET', key, 't', 'c', 'l')
local tokens = tonumber(st[1]) or burst
local credit = tonumber(st[2]) or 0
local last = tonumber(st[3]) or now
if not st[3] then
  -- A new state is a full bucket as of its first request, even one that takes nothing
  -- (sluice_limits' new_state(now)): a later request at an earlier time is read as at it.
  redis.call('HSET', key, 't', num(burst), 'c', '0', 'l', num(now))
  expire(key, 0)
end
local early = sat_sub(last, now)
local t = math.max(now, last)

-- Refill up to t: (tokens, credit).
local function refill()
  local elapsed = t - last
  if tokens >= burst then return burst, 0 end
  -- Full whatever the bucket held: this also keeps elapsed * count below 2^53.
  local fills_after = cdiv(burst * period, count) - 1
  if elapsed > fills_after then return burst, 0 end
  local cr = math.min(credit, period - 1)
  local sum = elapsed * count + cr
  if sum < period then return tokens, sum end
  if sum >= (burst - tokens) * period then return burst, 0 end
  local whole = idiv(sum, period)
  local rest = sum - whole * period
  if tokens + whole < burst then return tokens + whole, rest end
  return burst, 0
end

local rt, rc = refill()

-- Units of time until (tk, cr) holds `want` tokens.
local function time_to(tk, cr, want)
  if tk >= want then return 0 end
  return cdiv((want - tk) * period - cr, count)
end

local function store(tk, cr, at, idle_in)
  redis.call('HSET', key, 't', num(tk), 'c', num(cr), 'l', num(at))
  expire(key, idle_in)
end

local function decide(c)
  if c == 0 then return late(allow(rt, time_to(rt, rc, burst), nil), early) end
  if c > burst then return late(deny(rt, time_to(rt, rc, burst), -1), early) end
  if rt >= c then
    local left = rt - c
    local full_in = time_to(left, rc, burst)
    return late(allow(left, full_in, function() store(left, rc, t, full_in + early) end), early)
  end
  return late(deny(rt, time_to(rt, rc, burst), time_to(rt, rc, c)), early)
end

-- `c` permits admitted without Redis, taken now. Past the tokens held the bucket owes the
-- rest: it is stored empty as of the time the debt is paid back (a time ahead reads as time
-- gone back: the bucket decides as at that time), at most two bursts' refill ahead.
local function charge(c)
  if rt >= c then
    local left = rt - c
    store(left, rc, t, time_to(left, rc, burst) + early)
    return
  end
  local full = time_to(0, 0, burst)
  -- c is at most the burst (the caller caps a charge), so the rest owed is at most one
  -- bucket.
  local owed = time_to(0, rc, c - rt)
  -- now + 2 * full < 2^53 (checked by the caller): exact, as sluice_limits computes it.
  local paid = math.max(t, math.min(t + owed, now + 2 * full))
  store(0, 0, paid, paid - now + full)
end
