-- Fixed window (seed 002 §3.1), as sluice_limits::FixedWindow. KEYS[1]: a hash
-- {s = start of the counted window, l = latest admission time, u = permits used}.
-- HINCRBY and PEXPIRE in one script, so a counter never outlives its window for lack of
-- an EXPIRE (the race seed 002 §3.1 points out in INCR-then-EXPIRE).
local key = KEYS[1]
local st = redis.call('HMGET', key, 's', 'l', 'u')
local start = tonumber(st[1]) or 0
local last = tonumber(st[2]) or 0
local used0 = tonumber(st[3]) or 0
local first_request = param == 1

-- The window counted at t: its end and the permits already used in it.
local function window(t)
  local w_end, used
  if first_request then
    w_end = start + period
    if used0 > 0 and t < w_end then used = used0 else w_end = t + period; used = 0 end
  else
    local w_start = t - (t - idiv(t, period) * period)
    w_end = w_start + period
    if used0 > 0 and start >= w_start then used = used0 else used = 0 end
  end
  return w_end, used
end

local function store(t, w_end, used, after)
  local new_start = start
  if used == 0 then new_start = t end
  redis.call('HSET', key, 's', num(new_start), 'l', num(t), 'u', num(after))
  expire(key, w_end - now)
end

local function decide(c)
  local early = sat_sub(last, now)
  local t = math.max(now, last)
  local w_end, used = window(t)
  local fresh = used == 0
  local reset = 0
  if not fresh then reset = w_end - t end
  local n = count
  if c == 0 then return late(allow(sat_sub(n, used), reset, nil), early) end
  if c > n then return late(deny(sat_sub(n, used), reset, -1), early) end
  local after = used + c
  if after <= n then
    return late(allow(n - after, w_end - t, function()
      store(t, w_end, used, after)
    end), early)
  end
  return late(deny(sat_sub(n, used), reset, w_end - t), early)
end

-- `c` permits admitted without Redis: counted in the window as admissions, past the count
-- if need be (kept at most twice the count: past the count every request is refused alike).
local function charge(c)
  local t = math.max(now, last)
  local w_end, used = window(t)
  store(t, w_end, used, math.min(used + c, 2 * count))
end
