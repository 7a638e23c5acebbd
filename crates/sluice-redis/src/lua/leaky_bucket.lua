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

local cap = burst * period

-- ceil(a * b / c) for integers 0 <= a < c < 2^53, 0 <= b < 2^53, exactly although the
-- product may pass 2^53: a * b is built from the bits of b, highest first, as q * c + r
-- with 0 <= r < c (every step stays below 2^53; the result is at most b).
local function mul_cdiv(a, b, c)
  if a * b < 9007199254740992 then return cdiv(a * b, c) end
  local bits = {}
  while b > 0 do
    local h = math.floor(b / 2)
    bits[#bits + 1] = b - 2 * h
    b = h
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = 2 * q
    if r >= c - r then r = r - (c - r); q = q + 1 else r = 2 * r end
    if bits[i] == 1 then
      if r >= c - a then r = r - (c - a); q = q + 1 else r = r + a end
    end
  end
  if r > 0 then q = q + 1 end
  return q
end

-- The level in units of 1/period permit. After a change of period it is re-expressed
-- exactly, rounded up (a change of period loses no water), and kept at most twice the burst
-- (the most a charge leaves, which the range check covers).
local function level_in()
  if unit == period or level0 == 0 then return level0 end
  if unit == 0 then return 0 end
  local q = idiv(level0, unit)
  if q >= 2 * burst then return 2 * cap end
  -- q < 2 * burst: at most (q + 1) * period <= 2 * cap.
  return q * period + mul_cdiv(level0 - q * unit, period, unit)
end

local level = level_in()
local elapsed = t - last
if elapsed >= cdiv(level, count) then level = 0 else level = level - elapsed * count end
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
