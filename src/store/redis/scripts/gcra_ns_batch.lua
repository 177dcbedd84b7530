-- gcra_ns_batch: gcra_batch.lua for policies at ns precision (gcra_ns.lua).
-- KEYS: one per check. ARGV[3] = T (ns), ARGV[4] = tau (ns), ARGV[5] = cost.
-- Reply: { now (µs), then per check: the stored tat (a µs number, or the ns
-- encoding as a string) when admitted; when denied, −tat − 1 for a µs
-- number, '-' and the string for the ns encoding; or the error message of a
-- check that failed alone (it starts with a letter) }.

local now = now_us()
local t, tau, cost = ns_param(ARGV[3]), ns_param(ARGV[4]), tonumber(ARGV[5])
local out = { now }

local vals = redis.call('MGET', unpack(KEYS))
local inc_us, inc_r = ns_times(t, cost)
if inc_us < 8e12 then
  ns_inc_us, ns_inc_r, ns_inc_str = inc_us, inc_r, int(inc_us * 1000 + inc_r)
end
-- The fast path (see gcra_ns.lua), with its 3 µs margins: a tat `a` at or
-- past `ahead` is ahead of now; one at most `lim` − 3 is admitted (the new
-- tat is below a + 1.02 + inc_us + 1 <= now + tau_us), one past `lim` + 3
-- denied (above a − 1.02 + inc_us > now + tau_us + 1). Exact integers.
local fast = ns_inc_str ~= nil
local ahead, lim = now + 3, now + tau[1] - inc_us
local inc_f = inc_us + inc_r / 1000
local STEP, floor = GCRA_EXPIRY_STEP, math.floor
for i = 1, #KEYS do
  local key, v = KEYS[i], vals[i]
  if ns_fast[key] then
    ns_unfast(key)
  end
  local x = fast and v and #v == 19 and ns_us[key] == nil and tonumber(v)
  local a = x and x >= NS_MARK and x < 8.1e18 and (x - NS_MARK) / 1000
  local done = false
  if a and a >= ahead then
    if a <= lim - 3 then
      -- The expiry's second, before and after, where no multiple of the
      -- step lies within 3 µs (the subtractions are exact).
      local q, b = floor(a / STEP), a + inc_f
      local qb = floor(b / STEP)
      local ra, rb = a - q * STEP, b - qb * STEP
      if ra > 3 and ra < STEP - 3 and rb > 3 and rb < STEP - 3 then
        if cost > 0 then
          ns_fast[key] = v
          if qb > q then
            ns_fast_exp[key] = (qb + 1) * STEP
          end
        end
        out[i + 1], done = v, true
      end
    elseif a > lim + 3 then
      out[i + 1], done = '-' .. v, true
    end
  end
  if not done then
    local us, r
    if v and ns_us[key] == nil and gcra_valid(v) then
      us, r = ns_read(key, v)
    else
      us, r = ns_tat(key)
    end
    if not us then
      out[i + 1] = r
    else
      local allowed, n_us, n_r = ns_decide(us, r, inc_us, inc_r, tau, now)
      local tat = ns_reply(key, us, r)
      if allowed then
        if cost > 0 then
          ns_commit(key, n_us, n_r)
        end
        out[i + 1] = tat
      elseif type(tat) == 'number' then
        out[i + 1] = -tat - 1
      else
        out[i + 1] = '-' .. tat
      end
    end
  end
end
return finish(now, out)
