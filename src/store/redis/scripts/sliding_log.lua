-- Sliding log: a ZSET with one member per admitted unit, as the classic ZSET log
-- but exact. Score = admission time (µs); member = '<time>:<index>' with the
-- index zero-padded and counting the units already held at that instant, so
-- members are unique (never a bare timestamp, which collapses bursts in the
-- classic log) and, within one instant, sort in admission order. Denied attempts
-- are never recorded. Every step is O(log n): ZCARD counts the units, the
-- unit that must leave before a retry is found by rank.
-- p1 = max, p2 = window (µs). Every reported value is a difference of
-- timestamps, so the decision is computed here, exactly, in µs.

-- Drops units that left the window (t + w <= now); returns how many remain.
local function log_prune(key, w, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - w))
  return redis.call('ZCARD', key)
end

-- Time of the unit at `rank` (0 = oldest, -1 = newest), or nil.
local function log_time(key, rank)
  return tonumber(redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2])
end

local function log_expire(key, w, now)
  local newest = log_time(key, -1)
  if newest then
    redis.call('PEXPIRE', key, ttl_ms(newest + w - now))
  end
end

-- Records `cost` units at `now`, or at the newest instant if a clock that
-- went back left it later (as the model merges them into that entry).
local function log_add(key, w, cost, now)
  -- The newest member tells both the instant to record at and, when that
  -- instant is already held, how many units it has: indices at an instant
  -- run 0..k-1 (pruning removes whole instants, refunds the newest units),
  -- so the newest member's index + 1 is the count ZCOUNT would give.
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local at, base = now, 0
  local newest_at = tonumber(newest[2])
  if newest_at and newest_at >= now then
    at = newest_at
    local index = tonumber(string.match(newest[1], ':(%d+)$'))
    base = index and index + 1 or redis.call('ZCOUNT', key, int(at), int(at))
  end
  local args, i = {}, 0
  while i < cost do
    args[#args + 1] = int(at)
    args[#args + 1] = int(at) .. ':' .. string.format('%016.0f', base + i)
    i = i + 1
    if #args >= 200 or i == cost then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  redis.call('PEXPIRE', key, ttl_ms(at + w - now))
end

-- One check's reply fields and whether it is admitted (nothing written).
local function log_decide(key, max, w, cost, now)
  local total = log_prune(key, w, now)
  local allowed = total + cost <= max
  -- As the model: an admission is reported as the newest entry.
  local newest = nil
  if allowed and cost > 0 then
    newest = now
  elseif total > 0 then
    newest = log_time(key, -1)
  end
  local after = total
  if allowed then
    after = total + cost
  end
  local retry = -1
  if not allowed and cost <= max then
    -- The oldest total + cost - max units must leave first.
    retry = math.max(log_time(key, total + cost - max - 1) + w - now, 0)
  end
  local reset = 0
  if newest then
    reset = math.max(newest + w - now, 0)
  end
  -- As the model: more quota comes when the oldest unit leaves the window
  -- (the one being admitted if the window is empty).
  local quota = 0
  if max - after < max then
    local oldest = nil
    if total > 0 then
      oldest = log_time(key, 0)
    elseif allowed and cost > 0 then
      oldest = now
    end
    if oldest then
      quota = math.max(oldest + w - now, 0)
    end
  end
  -- After a downgrade the log may hold more than the new maximum.
  return allowed, math.max(max - after, 0), retry, reset, quota
end

algo.l = {
  -- A single-rule check, straight into the batch reply (no closures or
  -- tables per check); a key of another type fails alone.
  single = function(key, max, w, cost, now, out, n)
    local ok, allowed, remaining, retry, reset, quota = pcall(log_decide, key, max, w, cost, now)
    if not ok then
      return nil, type(allowed) == 'table' and allowed.err or allowed
    end
    if allowed and cost > 0 then
      log_add(key, w, cost, now)
    end
    out[n + 1] = 1
    out[n + 2] = allowed and 1 or 0
    out[n + 3] = remaining
    out[n + 4] = retry
    out[n + 5] = reset
    out[n + 6] = quota
    return n + 6
  end,

  check = function(key, max, w, cost, _, now)
    local allowed, remaining, retry, reset, quota = log_decide(key, max, w, cost, now)
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        log_add(key, w, cost, now)
      end
    end
    return allowed, { allowed and 1 or 0, remaining, retry, reset, quota }, commit
  end,

  refund = function(key, _, w, amount, now)
    if log_prune(key, w, now) > 0 then
      redis.call('ZREMRANGEBYRANK', key, int(-amount), -1)
      log_expire(key, w, now)
    end
  end,
}
