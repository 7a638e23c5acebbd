-- Shared by every Sluice script (prepended at compile time).
--
-- ARGV: 1 now ("server": read TIME, in microseconds; otherwise the caller's time in
-- the caller's unit), 2 count, 3 period, 4 burst, 5 cost, 6 partial ("1": grant what is
-- left when the whole cost is refused), 7 minimum TTL in ms, 8 time units per ms,
-- 9 algorithm parameter (fixed window: 1 = windows opened by the first request; sliding
-- window: the number of sub-windows), 10 permits to charge (absent or 0: decide; otherwise
-- count that many permits the caller admitted without Redis, unconditionally, and decide
-- nothing), 11 second algorithm parameter (warm-up: the cold factor; the others ignore it).
--
-- Lua numbers are doubles: integers are exact below 2^53 only. The Rust side checks that
-- every value a script computes stays below that bound before it calls (see `script.rs`),
-- and every division below is corrected to the exact integer quotient.
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local burst = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local partial = ARGV[6] == '1'
local min_ttl = tonumber(ARGV[7])
local units_per_ms = tonumber(ARGV[8])
local param = tonumber(ARGV[9])
local charge_n = tonumber(ARGV[10]) or 0
local now
if ARGV[1] == 'server' then
  -- Redis server time, so the clients' clocks do not matter. Microseconds: a unix time in
  -- nanoseconds (1.7e18) is past 2^53 and would lose precision.
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

-- floor(a / b) for integers 0 <= a < 2^53, 1 <= b < 2^53: the double quotient, corrected.
local function idiv(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

-- ceil(a / b), same domain.
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- An integer as Redis should store it: every digit, never "1.7e+15".
local function num(x)
  return string.format('%.0f', x)
end

local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

-- Expire `key` once the state is idle (decides as a missing key would) `idle_in` units
-- from now; never sooner than the minimum TTL (the caller's clock may be virtual).
local function expire(key, idle_in)
  local ms = cdiv(idle_in, units_per_ms) + 1
  if ms < min_ttl then ms = min_ttl end
  redis.call('PEXPIRE', key, num(ms))
end

-- A decision: allowed (bool), remaining, reset_after, retry_after (-1: never), and the
-- function that stores the new state (nil: nothing changes).
local function allow(remaining, reset, commit)
  return { allowed = true, remaining = remaining, reset = reset, retry = 0, commit = commit }
end

local function deny(remaining, reset, retry)
  return { allowed = false, remaining = remaining, reset = reset, retry = retry }
end

-- sluice_limits' `measured_from_caller`: a decision taken at the latest time seen, `early`
-- units after the caller's `now`, with its waits measured from the caller's `now`.
local function late(d, early)
  if early > 0 then
    if d.reset > 0 then d.reset = d.reset + early end
    if (not d.allowed) and d.retry >= 0 then d.retry = d.retry + early end
  end
  return d
end
