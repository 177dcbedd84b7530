-- gcra_batch: a batch of single-rule GCRA checks under ONE policy and cost,
-- the common shape of a busy batch. Evaluated in order, exactly as
-- check.lua would, with a leaner wire format on both sides: no per-check
-- arguments, and one number per check in the reply.
-- KEYS: one per check (a key may repeat: the later check sees the earlier).
-- ARGV[3] = T (ns), ARGV[4] = tau (ns), ARGV[5] = cost.
-- Reply: { now (µs), then per check: the tat's offset from now in ns (0
-- when past) when admitted, −offset − 1 when denied, or the error message
-- of a check that failed alone (a key of another type) }.

local now = now_us()
local t, tau, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local out = { now }

gcra_clock(now)
local vals = call_redis('MGET', unpack(KEYS))
local inc = t * cost
-- A cost beyond tau is denied whatever the state (see gcra.lua).
local fits = inc <= tau
gcra_step = inc
for i = 1, #KEYS do
  local key = KEYS[i]
  local d, failed = gcra_d[key], nil
  if d == nil then
    if vals[i] then
      d, failed = gcra_read(key, vals[i])
    else
      d, failed = gcra_tat(key)
    end
  end
  if failed then
    out[i + 1] = failed
  else
    local base = d > 0 and d or 0
    local new_d = base + inc
    if fits and new_d <= tau then
      if cost > 0 then
        gcra_d[key], gcra_dirty[key] = new_d, new_d
      end
      out[i + 1] = base
    else
      out[i + 1] = -base - 1
    end
  end
end
return finish(now, out)
