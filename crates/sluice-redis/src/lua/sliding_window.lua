-- Sliding window counter with K sub-windows (seed 002 §3.2), as
-- sluice_limits::SlidingWindow. KEYS[1]: a hash {w = sub-window width, h = newest
-- sub-window index, k = K, 0 .. K-1 = the counters of the ring}.
local key = KEYS[1]
local k = param
local width = math.max(cdiv(period, k), 1)
local raw = redis.call('HGETALL', key)
local f = {}
for i = 1, #raw, 2 do f[raw[i]] = tonumber(raw[i + 1]) end
local st_w = f['w'] or width
local st_h = f['h'] or 0
local st_k = f['k'] or k
local function stored(i) return f[tostring(i)] or 0 end

local same = st_k == k and st_w == width
local src_head, moved = st_h, 0
if not same then
  local kept = 0
  for i = 0, st_k - 1 do kept = kept + stored(i) end
  src_head = idiv(st_h * st_w, width)
  moved = kept
end
local head = math.max(idiv(now, width), src_head)

local function recorded(i)
  if i > src_head or i + k <= src_head then return 0 end
  if same then return stored(i - idiv(i, k) * k) end
  if i == src_head then return moved end
  return 0
end

-- Permits in sub-window head-K+1+s, s in 0..K-1 (oldest first).
local function slot(s)
  local i = head - (k - 1 - s)
  if i < 0 then return 0 end
  return recorded(i)
end

local sum = 0
for s = 0, k - 1 do sum = sum + slot(s) end

local function start_of(i) return sat_sub(i * width, now) end

local function reset(extra)
  for s = k - 1, 0, -1 do
    if slot(s) > 0 or (extra > 0 and s == k - 1) then return start_of(head + 1 + s) end
  end
  return 0
end

-- Counts `c` permits in the newest sub-window (sliding the ring to it first).
local function store(c)
  local hk = head - idiv(head, k) * k
  if same then
    -- Slide the ring in place: clear the sub-windows between the old head and the new.
    local stale = math.min(head - st_h, k)
    for i = 0, stale - 1 do
      local j = head - i
      redis.call('HDEL', key, tostring(j - idiv(j, k) * k))
    end
    redis.call('HSET', key, 'w', num(width), 'h', num(head), 'k', num(k))
  else
    -- The width changed: re-cut the window as sluice_limits does.
    local counts = {}
    for s = 0, k - 1 do counts[s] = slot(s) end
    redis.call('DEL', key)
    redis.call('HSET', key, 'w', num(width), 'h', num(head), 'k', num(k))
    for s = 0, k - 1 do
      if counts[s] > 0 then
        local j = hk + 1 + s
        redis.call('HSET', key, tostring(j - idiv(j, k) * k), num(counts[s]))
      end
    end
  end
  redis.call('HINCRBY', key, tostring(hk), num(c))
  expire(key, (head + k) * width - now)
end

local function decide(c)
  local n = count
  if c == 0 then return allow(sat_sub(n, sum), reset(0), nil) end
  if c > n then return deny(sat_sub(n, sum), reset(0), -1) end
  if sum + c <= n then
    return allow(n - sum - c, reset(c), function() store(c) end)
  end
  local left = sum
  local retry = -1
  for s = 0, k - 1 do
    left = left - slot(s)
    if left + c <= n then
      retry = start_of(head + 1 + s)
      break
    end
  end
  return deny(sat_sub(n, sum), reset(0), retry)
end

-- `c` permits admitted without Redis, counted as admitted now (past the count if need be; the
-- window is kept within twice the count).
local function charge(c)
  local add = math.min(c, sat_sub(2 * count, sum))
  if add > 0 then store(add) end
end
