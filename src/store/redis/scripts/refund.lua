-- refund: gives ARGV[6] units of a charge back to KEYS[1], into the slot its
-- receipt names: ARGV[7] = the charge's instant (µs), ARGV[8] = its permit
-- id or ''.
-- ARGV[3..5] = algorithm code, p1 (a count), p2 (a duration in ns).
-- Reply: now (µs).

local now = now_us()
local a = algo[ARGV[3]]
if not a then
  return redis.error_reply('ERR tower-throttle: unknown algorithm')
end
local form, p1, p2 = pick(a, ARGV[4], ARGV[5])
-- Foreign data at the key (of another type, or no state of this crate) is
-- deleted and answered as a FOREIGN error naming it (see `foreign`).
local receipt = { at = tonumber(ARGV[7]), permit = ARGV[8] }
local ok, err = pcall(form.refund, KEYS[1], p1, p2, tonumber(ARGV[6]), now, receipt)
if not ok then
  return redis.error_reply(call_error(KEYS[1], err))
end
return now
