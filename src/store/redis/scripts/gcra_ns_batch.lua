-- gcra_ns_batch: gcra_batch.lua for policies at ns precision (gcra_ns.lua).
-- KEYS: one per check. ARGV[3] = T (ns), ARGV[4] = tau (ns), ARGV[5] = cost.
-- Reply: { now (µs), then per check: the stored tat (a µs number, or the ns
-- encoding as a string) when admitted; when denied, −tat − 1 for a µs
-- number, '-' and the string for the ns encoding; or the error message of a
-- check that failed alone (it starts with a letter) }.

local now = now_us()
local t, tau, cost = ns_param(ARGV[3]), ns_param(ARGV[4]), tonumber(ARGV[5])
local out = { now }

algo.n.prefetch(KEYS)
local inc_us, inc_r = ns_times(t, cost)
if inc_us < 8e12 then
  ns_inc_us, ns_inc_r, ns_inc_str = inc_us, inc_r, int(inc_us * 1000 + inc_r)
end
for i = 1, #KEYS do
  local key = KEYS[i]
  local us, r = ns_tat(key)
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
return finish(now, out)
