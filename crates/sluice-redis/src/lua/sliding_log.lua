-- Sliding log (seed 002 §3.5), as sluice_limits::SlidingLog. KEYS[1]: a sorted set of the
-- admitted requests, score = admission time, member = the running total of admitted
-- permits after it (zero-padded, so members of equal score sort by it and the total is
-- monotone along the ranks). KEYS[2]: a hash {b = total before the oldest entry kept,
-- c = running total, l = latest admission time}. Both keys carry the same hash tag.
local log, meta = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'b', 'c', 'l')
local base = tonumber(m[1]) or 0
local total = tonumber(m[2]) or 0
local last = tonumber(m[3]) or 0
local early = sat_sub(last, now)
local t = math.max(now, last)

-- Entries at or before `cutoff` have left the window (t - period, t].
local cutoff = nil
if t >= period then cutoff = t - period end
-- The running total before the first live entry: that of the newest entry that left.
local before = base
if cutoff ~= nil then
  local gone = redis.call('ZREVRANGEBYSCORE', log, num(cutoff), '-inf', 'LIMIT', 0, 1)
  if #gone > 0 then before = tonumber(gone[1]) end
end
local used = total - before
local function newest_out(at) return sat_sub(at + period, t) end
local reset = 0
if used > 0 then
  local back = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #back > 0 then reset = newest_out(tonumber(back[2])) end
end

-- Only differences of running totals decide, so they can all be moved by one amount: once
-- the total would reach 2^52, every total kept becomes itself less `before` (the total
-- before the oldest entry kept; 0 afterwards). A hot key's total then stays below 2^53
-- however long it lives (without this, at 10^9 permits per second, a per-byte cost at
-- 1 GB/s, it would pass 2^53 after 104 days and the sums would lose permits): what is kept
-- holds at most twice the count, which is below 2^53 / 3. The live log is rewritten once
-- per 2^52 - 2 * count permits admitted (at least 2^51 for a count below 2^50).
local function rebase()
  local kept = redis.call('ZRANGE', log, 0, -1, 'WITHSCORES')
  redis.call('DEL', log)
  local args = {}
  for i = 1, #kept, 2 do
    args[#args + 1] = num(tonumber(kept[i + 1]))
    args[#args + 1] = string.format('%016.0f', tonumber(kept[i]) - before)
    if #args >= 1000 or i + 2 > #kept then
      redis.call('ZADD', log, unpack(args))
      args = {}
    end
  end
  total = total - before
  before = 0
end

-- Logs `c` permits admitted at t (one entry: its running total says how many).
local function store(c)
  if cutoff ~= nil then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', num(cutoff))
  end
  if total + c >= 4503599627370496 then rebase() end
  local after = total + c
  redis.call('ZADD', log, num(t), string.format('%016.0f', after))
  redis.call('HSET', meta, 'b', num(before), 'c', num(after), 'l', num(t))
  expire(log, t + period - now)
  expire(meta, t + period - now)
end

local function decide(c)
  local n = count
  local remaining = sat_sub(n, used)
  if c == 0 then return late(allow(remaining, reset, nil), early) end
  if c > n then return late(deny(remaining, reset, -1), early) end
  if c <= remaining then
    return late(allow(remaining - c, newest_out(t), function() store(c) end), early)
  end
  -- The first entry whose running total reaches total - (n - c) must leave first: binary
  -- search over the ranks (all entries kept, as sluice_limits searches its whole log).
  local target = total - (n - c)
  local lo, hi = 0, redis.call('ZCARD', log) - 1
  local at = nil
  while lo <= hi do
    local mid = idiv(lo + hi, 2)
    local e = redis.call('ZRANGE', log, mid, mid, 'WITHSCORES')
    if tonumber(e[1]) >= target then
      at = tonumber(e[2])
      hi = mid - 1
    else
      lo = mid + 1
    end
  end
  local retry = -1
  if at ~= nil then retry = newest_out(at) end
  return late(deny(remaining, reset, retry), early)
end

-- `c` permits admitted without Redis, logged as admitted at t (past the count if need be; the
-- window is kept within twice the count).
local function charge(c)
  local add = math.min(c, sat_sub(2 * count, used))
  if add > 0 then store(add) end
end
