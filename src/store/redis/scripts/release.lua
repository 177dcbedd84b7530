-- release: drops the lease of permit ARGV[3] from KEYS[1] (concurrency).
-- With ARGV[4] (the lease, µs), a permit not found leaves a tombstone for
-- that long: its check may still be on its way to the server (sent before a
-- stall, on a connection since replaced), and must not be granted then.
-- Reply: 1 if the permit was still held, else 0.

-- Foreign data at the key is deleted and answered as a FOREIGN error.

local now = now_us()

local function release()
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
  local lease = tonumber(ARGV[4])
  if found == 1 then
    lease_expire(KEYS[1], now)
  elseif lease then
    redis.call('ZADD', KEYS[1], int(now + lease), 'x:' .. ARGV[3])
    lease_expire(KEYS[1], now)
  end
  return found
end

local ok, found = pcall(release)
if not ok then
  return redis.error_reply(call_error(KEYS[1], found))
end
return found
