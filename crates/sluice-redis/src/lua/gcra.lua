-- GCRA (seed 002 §3.4, the token bucket as one number), as sluice_limits::Gcra. KEYS[1]: a
-- string holding TAT, the theoretical arrival time (missing: 0, a full bucket).
local key = KEYS[1]
local tat = tonumber(redis.call('GET', key)) or 0
local T = math.max(cdiv(period, count), 1)
local tolerance = burst * T

local function decide(c)
  local base = math.max(tat, now)
  if c >= 1 and c <= burst then
    local inc = c * T
    if now + tolerance >= inc and base <= now + tolerance - inc then
      local new_tat = base + inc
      local debt = new_tat - now
      local remaining
      if tat <= now then remaining = burst - c else remaining = idiv(tolerance - debt, T) end
      return allow(remaining, debt, function()
        redis.call('SET', key, num(new_tat))
        expire(key, debt)
      end)
    end
  end
  local debt = base - now
  local remaining = idiv(sat_sub(tolerance, debt), T)
  if c == 0 then return allow(remaining, debt, nil) end
  local retry = -1
  if c <= burst then retry = base + c * T - now - tolerance end
  return deny(remaining, debt, retry)
end

-- `c` permits admitted without Redis, counted as admitted now (past the tolerance if need be;
-- TAT is kept within twice the tolerance ahead, so it stays exact).
local function charge(c)
  local new_tat = math.max(tat, math.min(math.max(tat, now) + c * T, now + 2 * tolerance))
  redis.call('SET', key, num(new_tat))
  expire(key, new_tat - now)
end
