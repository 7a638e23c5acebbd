-- Warm-up ramp (Guava SmoothWarmingUp, seed 002 §3.4), as sluice_limits::WarmUp. KEYS[1]: a
-- hash {n = next free instant, c = stored permits as a fraction of the maximum (1 = cold),
-- l = latest admission time}. A missing key is {0, 1, 0}, sluice_limits' new state.
-- ARGV[9] is the warm-up period in the call's time unit, ARGV[11] the cold factor.
--
-- The state is floating point, as in sluice_limits: Lua numbers are IEEE doubles, so the same
-- operations in the same order give the same bits; `c` is stored with 17 significant digits,
-- which reads back as the same double. Times stay integers below 2^53 (checked by the caller).
local key = KEYS[1]
local warmup = param
local cold_factor = tonumber(ARGV[11])
local st = redis.call('HMGET', key, 'n', 'c', 'l')
local next_free0 = tonumber(st[1]) or 0
local coldness0 = tonumber(st[2]) or 1
local last = tonumber(st[3]) or 0
local early = sat_sub(last, now)
local t = math.max(now, last)

-- Guava resync: coldness and next free instant after idling until t.
local coldness, next_free = coldness0, next_free0
if t > next_free0 then
  if warmup == 0 then
    coldness = 0
  else
    coldness = math.min(coldness0 + (t - next_free0) / warmup, 1.0)
  end
  next_free = t
end
local wait = next_free - t
local free = wait == 0

-- The curve (sluice_limits' Curve::new), operation for operation.
local stable = period / count
local cold = stable * cold_factor
local threshold = 0.5 * warmup / stable
local max = threshold + 2.0 * warmup / (stable + cold)
local span = max - threshold
local slope = 0.0
if span > 0.0 then slope = (cold - stable) / span end

local function interval(x) return stable + x * slope end

-- The cost of taking `take` permits when `stored` are in the store (Curve::cost).
local function pay_for(stored, take)
  local from_store = math.min(take, stored)
  local above = math.max(stored - threshold, 0.0)
  local ns = 0.0
  local rest = from_store
  if above > 0.0 then
    local a = math.min(above, rest)
    ns = ns + a * (interval(above) + interval(above - a)) / 2.0
    rest = rest - a
  end
  return ns + (rest + (take - from_store)) * stable
end

-- Stored fraction left after taking `take` permits from `stored`.
local function left_after(stored, take)
  if max > 0.0 then
    local f = math.max(stored - take, 0.0) / max
    if f < 0.0 then return 0.0 end
    if f > 1.0 then return 1.0 end
    return f
  end
  return 0.0
end

local function store(nf, c)
  redis.call('HSET', key, 'n', num(nf), 'c', string.format('%.17g', c), 'l', num(t))
  -- Idle (decides as a missing key) once free and cold again; the extra units cover the
  -- rounding of coldness + d/warmup reaching 1.
  local idle_in = nf - now
  if warmup > 0 then idle_in = idle_in + math.ceil((1.0 - c) * warmup) + 2 end
  expire(key, idle_in)
end

local function decide(c)
  local b = burst
  local room = 0
  if free then room = b end
  if c == 0 then return late(allow(room, wait, nil), early) end
  if c > b then return late(deny(room, wait, -1), early) end
  if not free then return late(deny(0, wait, wait), early) end
  local stored = coldness * max
  local pay = math.max(math.ceil(pay_for(stored, c)), 1.0)
  local nf = t + pay
  local left = left_after(stored, c)
  return late(allow(0, nf - t, function() store(nf, left) end), early)
end

-- `c` permits admitted without Redis, taken now: paid forward from the next free instant
-- (the key need not be free), which stays within `reach` ahead (two bursts at the cold
-- interval, sluice_limits' WarmUp::reach), as sluice_limits' WarmUp::charge.
local function charge(c)
  local stored = coldness * max
  local pay = math.max(math.ceil(pay_for(stored, c)), 1.0)
  local reach = 2 * (math.ceil(burst * cold) + 1)
  local nf = math.max(next_free, math.min(next_free + pay, t + reach))
  store(nf, left_after(stored, c))
end
