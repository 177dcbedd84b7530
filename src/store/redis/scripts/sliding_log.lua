-- Sliding log: a ZSET of admitted units. Score = admission time (µs);
-- member = '<time>:<units>'. Units admitted at one instant share one member
-- carrying their count (times are strictly increasing, so members are unique
-- and never collapse the way a bare millisecond member did in the seeds).
-- Denied attempts are never recorded. p1 = max, p2 = window (µs).
-- Every reported value is a difference of timestamps, so the decision is
-- computed here, exactly, in µs.

local function log_units(member)
  return tonumber(string.match(member, ':(%d+)$')) or 0
end

-- Drops entries that left the window (t + w <= now); returns the rest,
-- oldest first, as { times, units, members } and their total.
local function log_load(key, w, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - w))
  local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local times, units, members, total = {}, {}, {}, 0
  for i = 1, #raw, 2 do
    local n = log_units(raw[i])
    members[#members + 1] = raw[i]
    times[#times + 1] = tonumber(raw[i + 1])
    units[#units + 1] = n
    total = total + n
  end
  return times, units, members, total
end

local function log_put(key, t, n)
  redis.call('ZADD', key, int(t), int(t) .. ':' .. int(n))
end

local function log_expire(key, w, times, now)
  local newest = times[#times]
  if newest then
    redis.call('PEXPIRE', key, ttl_ms(newest + w - now))
  end
end

algo.l = {
  check = function(key, max, w, cost, _, now)
    local times, units, members, total = log_load(key, w, now)
    local allowed = total + cost <= max
    local last = #times
    -- As the model: an admission is reported as the newest entry, even if a
    -- clock that went back merges it into a later one (kept for the TTL).
    local newest = nil
    if allowed and cost > 0 then
      newest = now
    elseif total > 0 then
      newest = times[last]
    end
    local after = total
    if allowed then
      after = total + cost
    end
    local retry = -1
    if not allowed and cost <= max then
      local must_leave, left = total + cost - max, 0
      for i = 1, last do
        left = left + units[i]
        if left >= must_leave then
          retry = math.max(times[i] + w - now, 0)
          break
        end
      end
    end
    local reset = 0
    if newest then
      reset = math.max(newest + w - now, 0)
    end
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        if last > 0 and times[last] >= now then
          redis.call('ZREM', key, members[last])
          log_put(key, times[last], units[last] + cost)
        else
          log_put(key, now, cost)
        end
        redis.call('PEXPIRE', key, ttl_ms(math.max(now, times[last] or now) + w - now))
      end
    end
    return allowed, { allowed and 1 or 0, max - after, retry, reset }, commit
  end,

  refund = function(key, _, w, amount, now)
    local times, units, members = log_load(key, w, now)
    while amount > 0 and #times > 0 do
      local i = #times
      local take = math.min(amount, units[i])
      amount = amount - take
      redis.call('ZREM', key, members[i])
      if units[i] > take then
        log_put(key, times[i], units[i] - take)
      else
        times[i] = nil
      end
    end
    log_expire(key, w, times, now)
  end,
}
