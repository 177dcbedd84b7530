-- release: drops the lease of permit ARGV[3] from KEYS[1] (concurrency).
-- Reply: 1 if the permit was still held, else 0.

local now = now_us()
local raw = redis.call('ZRANGE', KEYS[1], 0, -1)
local found = 0
for i = 1, #raw do
  local _, id = lease_parse(raw[i])
  if id == ARGV[3] then
    redis.call('ZREM', KEYS[1], raw[i])
    found = 1
    break
  end
end
if found == 1 then
  lease_expire(KEYS[1], now)
end
return found
