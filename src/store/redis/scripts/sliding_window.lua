-- Sliding-window counter: a string "<window index>:<current>:<previous>".
-- p1 = max, p2 = window, sent in ns: run in µs when it is whole µs, else in
-- ns (index and elapsed ns come exactly from win_divmod in window.lua, and
-- the index is the same number in either unit, so both forms share the
-- key). Admission compares integers scaled by the window,
-- prev*(w - elapsed) + cur*w + cost*w <= max*w, exactly whatever their size
-- (win_fits: in limbs where a product passes 2^53). The reply carries the
-- stored state; Rust renders the decision with
-- crate::algorithm::sliding_window::check (its retry_after divides, which is
-- not scale-free between µs and ns, so it is computed there, in ns).
--
-- Batches read each key once (one MGET), keep its state in
-- `sliding_states` and write each changed key once at the end, as for GCRA.

local sliding_states = {}
local sliding_dirty = {}

-- Valid states: as a fixed window's (an index below 1000·2^52, counts of
-- at most 2^50); anything else is foreign: nil.
local SLIDING_WHAT = 'a value that is no sliding-window state'
local SLIDING_MAX_COUNT = 1125899906842624 -- 2^50

local function sliding_parse(v)
  if not v then
    return 0, 0, 0
  end
  local w, c, p = string.match(v, '^(%d+):(%d+):(%d+)$')
  local win = w and win_parse(w)
  local cur, prev = stored_int(c, SLIDING_MAX_COUNT), stored_int(p, SLIDING_MAX_COUNT)
  if win and cur and prev then
    return win, cur, prev
  end
  return nil
end

-- The state of `key` for this batch, or nil and the error of foreign data
-- (a future window without expiry: see fixed_state).
local function sliding_state(key, w, ns, now)
  local s, err = cached_state(sliding_states, key, sliding_parse, SLIDING_WHAT)
  if s and win_lt((win_pos(now, w, ns)), s[1]) and not sliding_dirty[key] and persistent(key) then
    sliding_states[key] = nil
    return nil, foreign(key, 'a future window without expiry')
  end
  return s, err
end

-- The live window, its counts and the time into it, at `now`: a stored
-- window after now's (a clock that went back) stays, with elapsed 0.
local function sliding_live(sw, sc, sp, w, ns, now)
  local index, elapsed = win_pos(now, w, ns)
  if win_lt(sw, index) then
    if win_eq(win_add(sw, 1), index) then
      return index, 0, sc, elapsed
    end
    return index, 0, 0, elapsed
  elseif win_eq(sw, index) then
    return sw, sc, sp, elapsed
  end
  return sw, sc, sp, 0
end

local function sliding_write(key, now, w, ns, win, cur, prev)
  local left = 0
  if cur > 0 then
    left = 2
  elseif prev > 0 then
    left = 1
  end
  if left == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, win_str(win) .. ':' .. int(cur) .. ':' .. int(prev),
      'PX', ttl_ms(win_until(now, w, ns, win_add(win, left))))
  end
end

local sliding_prefetch = string_state(sliding_states, sliding_dirty, sliding_parse, sliding_write)

-- The algorithm for windows in µs (ns = false) or ns (ns = true).
local function sliding_algo(ns)
  return {
    prefetch = sliding_prefetch,

    -- A single-rule check, straight into the batch reply (see fixed_window).
    single = function(key, max, w, cost, now, out, n)
      local s, err = sliding_state(key, w, ns, now)
      if not s then
        return nil, err
      end
      local win, cur, prev, elapsed = sliding_live(s[1], s[2], s[3], w, ns, now)
      local allowed = 0
      if win_fits(prev, cur, cost, max, w, elapsed) then
        allowed = 1
        if cost > 0 then
          sliding_states[key] = { win, cur + cost, prev }
          sliding_dirty[key] = { w, ns, win, cur + cost, prev }
        end
      end
      out[n + 1] = 1
      out[n + 2] = allowed
      out[n + 3] = win_reply(s[1])
      out[n + 4] = s[2]
      out[n + 5] = s[3]
      return n + 5
    end,

    check = function(key, max, w, cost, _, now)
      local s, err = sliding_state(key, w, ns, now)
      if not s then
        error({ err = err })
      end
      local win, cur, prev, elapsed = sliding_live(s[1], s[2], s[3], w, ns, now)
      local allowed = win_fits(prev, cur, cost, max, w, elapsed)
      local commit = nil
      if allowed and cost > 0 then
        commit = function()
          sliding_states[key] = { win, cur + cost, prev }
          sliding_dirty[key] = { w, ns, win, cur + cost, prev }
        end
      end
      return allowed, { allowed and 1 or 0, win_reply(s[1]), s[2], s[3] }, commit
    end,

    -- Into the count of the charge's own window: current while it lasts,
    -- previous in the window after it, nothing once it has left.
    refund = function(key, _, w, amount, now, receipt)
      local s, err = sliding_state(key, w, ns, now)
      if not s then
        error({ err = err })
      end
      local sw, sc, sp = s[1], s[2], s[3]
      local win, cur, prev = sliding_live(sw, sc, sp, w, ns, now)
      local charged = win_index_at(receipt.at, w, ns)
      if win_eq(win, charged) then
        sliding_write(key, now, w, ns, win, math.max(cur - amount, 0), prev)
      elseif win_eq(win, win_add(charged, 1)) then
        sliding_write(key, now, w, ns, win, cur, math.max(prev - amount, 0))
      end
    end,
  }
end

algo.s = sliding_algo(false)
algo.s.ns = sliding_algo(true)
