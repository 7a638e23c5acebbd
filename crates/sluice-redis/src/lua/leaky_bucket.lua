-- Leaky bucket meter (seed 002 §3.3, nginx limit_req nodelay), as
-- sluice_limits::LeakyBucket. KEYS[1]: a hash {v = level in units of 1/u permit,
-- u = the period the level is measured in, l = time of the level}.
local key = KEYS[1]
local st = redis.call('HMGET', key, 'v', 'u', 'l')
local level0 = tonumber(st[1]) or 0
local unit = tonumber(st[2]) or 0
local last = tonumber(st[3]) or 0
local early = sat_sub(last, now)
local t = math.max(now, last)

-- The level in units of 1/period permit, rounded up (a change of period loses no water).
local function level_in()
  if unit == period or level0 == 0 then return level0 end
  if unit == 0 then return 0 end
  local q = idiv(level0, unit)
  local r = level0 - q * unit
  local p = r * period
  local up
  if p < 9007199254740992 then
    up = cdiv(p, unit)
  else
    -- Past 2^53 the product is not exact: round up generously (never less water).
    up = math.ceil(p / unit) + 1
  end
  return q * period + up
end

local level = level_in()
local elapsed = t - last
if elapsed >= cdiv(level, count) then level = 0 else level = level - elapsed * count end

local cap = burst * period
local function room(l) return idiv(sat_sub(cap, l), period) end
local function drain_time(u) return cdiv(u, count) end

local function store(after)
  redis.call('HSET', key, 'v', num(after), 'u', num(period), 'l', num(t))
  expire(key, drain_time(after) + early)
end

local function decide(c)
  if c == 0 then return late(allow(room(level), drain_time(level), nil), early) end
  if c > burst then return late(deny(room(level), drain_time(level), -1), early) end
  local after = level + c * period
  if after <= cap then
    return late(allow(room(after), drain_time(after), function() store(after) end), early)
  end
  return late(deny(room(level), drain_time(level), drain_time(after - cap)), early)
end

-- `c` permits admitted without Redis, poured in now (past the burst if need be; the level is
-- kept within twice the burst, so it stays exact).
local function charge(c)
  store(math.max(level, math.min(level + c * period, 2 * cap)))
end
