-- gcra_batch: a batch of single-rule GCRA checks under ONE policy and cost,
-- the common shape of a busy batch. Evaluated in order, exactly as
-- check.lua would, with a leaner wire format on both sides: no per-check
-- arguments, and one number per check in the reply.
-- KEYS: one per check (a key may repeat: the later check sees the earlier).
-- ARGV[3] = T (µs), ARGV[4] = tau (µs), ARGV[5] = cost.
-- Reply: { now (µs), then per check: the stored tat when admitted, -tat - 1
-- when denied (exact: |tat| < 2^53), or the error message of a check that
-- failed alone (a key of another type) }.

local now = now_us()
local t, tau, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local out = { now }

gcra_prefetch(KEYS)
local horizon = now + tau
local inc = t * cost
gcra_step = inc
for i = 1, #KEYS do
  local key = KEYS[i]
  local tat, failed = gcra_tats[key], nil
  if tat == nil then
    tat, failed = gcra_tat(key)
  end
  if failed then
    out[i + 1] = failed
  else
    local new_tat = (tat > now and tat or now) + inc
    if new_tat <= horizon then
      if cost > 0 then
        gcra_tats[key] = new_tat
        gcra_dirty[key] = new_tat
      end
      out[i + 1] = tat
    else
      out[i + 1] = -tat - 1
    end
  end
end
return finish(now, out)
