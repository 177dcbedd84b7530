-- Sliding log: a ZSET with one member per admitted unit, as the classic ZSET log
-- but exact. Score = admission time (µs); member = '<time>:<index>' with the
-- index zero-padded and counting the units already held at that instant, so
-- members are unique (never a bare timestamp, which collapses bursts in the
-- classic log) and, within one instant, sort in admission order. Denied attempts
-- are never recorded. Every step is O(log n): ZCARD counts the units, the
-- unit that must leave before a retry is found by rank.
-- p1 = max, p2 = window (µs). Every reported value is a difference of
-- timestamps, so the decision is computed here, exactly, in µs.
--
-- The ns form: a window W in ns that is not whole µs, W = 1000·wq + wr with
-- 0 < wr < 1000. Times stay whole µs (every unit is recorded at a `now`). A
-- unit at t has left when 1000·t + W <= 1000·now, which for integers t, now
-- is t + wq + 1 <= now: pruning uses the width wq + 1 (µs) and is exact. The
-- time a unit still has, 1000·(t − now) + W ns, is replied as its µs part
-- m = t + wq − now (>= 0 for a unit still in the window) and Rust adds wr;
-- -1 stands for "none" (a zero duration, or no retry).

-- Drops units that left the window (t + w <= now, w the prune width);
-- returns how many remain.
local function log_prune(key, w, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - w))
  return redis.call('ZCARD', key)
end

-- A valid log holds scores that are times this crate recorded: integers
-- in [0, 2^52). Every score a check reads is checked (the oldest and the
-- newest are read whenever the log is not empty, which bounds all of them);
-- a score such as 1e30 or inf would keep its unit in the window forever.
-- Members are not parsed for decisions, so only their scores matter.
local function log_valid_time(key, t)
  local x = tonumber(t)
  if x and x >= 0 and x < LIMIT and x % 1 == 0 then
    return x
  end
  error({ err = foreign(key, 'a sorted set whose scores are no log times') })
end

-- Time of the unit at `rank` (0 = oldest, -1 = newest), or nil.
local function log_time(key, rank)
  local t = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2]
  if t == nil then
    return nil
  end
  return log_valid_time(key, t)
end

-- Checks both ends of a log that is not empty (bounding every score) and
-- returns the newest time. A unit after `now` (a clock that went back) is
-- valid only with the expiry every write sets; without one it would never
-- leave.
local function log_ends(key, now)
  log_time(key, 0)
  local last = log_time(key, -1)
  if last > now and persistent(key) then
    error({ err = foreign(key, 'a sorted set of future times without expiry') })
  end
  return last
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
  local newest_at = newest[2] and log_valid_time(key, newest[2])
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

-- Time left to a unit at t (see the top).
local function log_left(wv, ns, now, t)
  if ns then
    return t + wv - now
  end
  return math.max(t + wv - now, 0)
end

-- One check's reply fields and whether it is admitted (nothing written):
-- wp = prune width (µs), wv = the window's whole µs, ns = the ns form.
local function log_decide(key, max, wp, wv, ns, cost, now)
  local total = log_prune(key, wp, now)
  local allowed = total + cost <= max
  local none = ns and -1 or 0
  local last = nil
  if total > 0 then
    last = log_ends(key, now)
  end
  -- As the model: an admission is reported as the newest entry.
  local newest = last
  if allowed and cost > 0 then
    newest = now
  end
  local after = total
  if allowed then
    after = total + cost
  end
  local retry = -1
  if not allowed and cost <= max then
    -- The oldest total + cost - max units must leave first.
    retry = log_left(wv, ns, now, log_time(key, total + cost - max - 1))
  end
  local reset = none
  if newest then
    reset = log_left(wv, ns, now, newest)
  end
  -- As the model: more quota comes when the oldest unit leaves the window
  -- (the one being admitted if the window is empty).
  local quota = none
  if max - after < max then
    local oldest = nil
    if total > 0 then
      oldest = log_time(key, 0)
    elseif allowed and cost > 0 then
      oldest = now
    end
    if oldest then
      quota = log_left(wv, ns, now, oldest)
    end
  end
  -- After a downgrade the log may hold more than the new maximum.
  return allowed, math.max(max - after, 0), retry, reset, quota
end

-- The log's widths for p2: (prune width, whole µs) of a window in µs, or in
-- ns (see the top).
local function log_widths(w, ns)
  if not ns then
    return w, w
  end
  local wq = dur_split(w)
  return wq + 1, wq
end

local function log_algo(ns)
  return {
    -- A single-rule check, straight into the batch reply (no closures or
    -- tables per check); a key of another type fails alone.
    single = function(key, max, w, cost, now, out, n)
      local wp, wv = log_widths(w, ns)
      local ok, allowed, remaining, retry, reset, quota =
        pcall(log_decide, key, max, wp, wv, ns, cost, now)
      if not ok then
        return nil, call_error(key, allowed)
      end
      if allowed and cost > 0 then
        log_add(key, wp, cost, now)
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
      local wp, wv = log_widths(w, ns)
      local ok, allowed, remaining, retry, reset, quota =
        pcall(log_decide, key, max, wp, wv, ns, cost, now)
      if not ok then
        error({ err = call_error(key, allowed) })
      end
      local commit = nil
      if allowed and cost > 0 then
        commit = function()
          log_add(key, wp, cost, now)
        end
      end
      return allowed, { allowed and 1 or 0, remaining, retry, reset, quota }, commit
    end,

    -- The charge's own units (at its instant, the highest indices there,
    -- as the model takes them), not the newest: those may be another
    -- request's. Units that have left the window are not given back.
    refund = function(key, _, w, amount, now, receipt)
      local wp = log_widths(w, ns)
      if log_prune(key, wp, now) > 0 then
        log_ends(key, now)
        local at = int(receipt.at)
        local held = redis.call('ZRANGEBYSCORE', key, at, at)
        local args = {}
        for i = #held, math.max(#held - amount + 1, 1), -1 do
          args[#args + 1] = held[i]
          if #args >= 200 then
            redis.call('ZREM', key, unpack(args))
            args = {}
          end
        end
        if #args > 0 then
          redis.call('ZREM', key, unpack(args))
        end
        log_expire(key, wp, now)
      end
    end,
  }
end

algo.l = log_algo(false)
algo.l.ns = log_algo(true)
