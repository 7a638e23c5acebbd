-- Shared epilogue: decide, grant what is left if asked to, store, answer.
if charge_n > 0 then
  -- A fallback's local admissions, counted as admitted now whatever the limit says (each
  -- algorithm's `charge` keeps its state within twice the limit, so it stays exact).
  charge(charge_n)
  return { 1, count, 0, 0, 0, charge_n }
end
local d = decide(cost)
local granted = 0
if d.allowed then
  granted = cost
elseif partial and cost > 0 and d.remaining > 0 then
  -- Batched mode: take what the limit still holds (never more than `remaining`, which
  -- every algorithm admits).
  local part = math.min(cost, d.remaining)
  local d2 = decide(part)
  if d2.allowed then
    d = d2
    granted = part
  end
end
if d.allowed and d.commit ~= nil then d.commit() end
local allowed = 0
if d.allowed then allowed = 1 end
return { allowed, count, d.remaining, d.reset, d.retry, granted }
