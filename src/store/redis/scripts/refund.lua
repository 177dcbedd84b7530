-- refund: gives ARGV[6] units back to KEYS[1].
-- ARGV[3..5] = algorithm code, p1, p2. Reply: now (µs).

local now = now_us()
local a = algo[ARGV[3]]
if not a then
  return redis.error_reply('ERR tower-throttle: unknown algorithm')
end
local param = a.param or tonumber
a.refund(KEYS[1], param(ARGV[4]), param(ARGV[5]), tonumber(ARGV[6]), now)
return now
