-- Fixed window: the window's index and its count, in one of two forms:
-- * packed, one integer index·2^20 + count, while the index is below 2^33
--   (windows of 0.22 s or more until the year 2500) and the count below
--   2^20: the form a busy key's admission updates in place, with an
--   INCRBY of the units (keeping the key's expiry), as GCRA's tat is;
-- * else the string "<window index>:<count>".
-- Both read back to the same (index, count); each write picks the form.
-- p1 = max, p2 = window, sent in ns: run in µs when it is whole µs, else in
-- ns (windows from 1 ns to 2^50 µs, `pick` in common.lua: the index is
-- floor(1000·now / w), computed exactly by win_divmod in window.lua, and
-- from 2^53 on, for windows under 1 µs, an index pair). The index is the
-- same number in either unit, so both forms share the key and its state. The reply carries the stored state; Rust
-- renders the decision with crate::algorithm::fixed_window::check.
--
-- As for GCRA, a batch reads each key once (one MGET for all of them),
-- keeps its state in `fixed_states`, and writes each changed key once at
-- the end: the state and TTL that writing after every admission would
-- leave, at one write per key instead of three calls. A key that already
-- holds the written window keeps its expiry (every write of a window sets
-- the same one, its end): a packed count grows by INCRBY, a string is
-- replaced with `SET … KEEPTTL` (Redis 6.0); only a key's first write of a
-- window sets the expiry.

local fixed_states = {}
local fixed_dirty = {}

-- Valid states: a window index below 1000·2^52 (win_parse) and a count
-- of at most 2^50 (Rust's bound on a limit; a count never
-- exceeds the limit it was admitted under). Anything else ("abc", "-5",
-- "1e30", "1.5:2", a count beyond 2^50) is foreign: nil.
local FIXED_WHAT = 'a value that is no fixed-window state'
local MAX_COUNT = 1125899906842624 -- 2^50
local PACK = 1048576 -- 2^20: a packed state is index·PACK + count
local PACK_WINDOWS = 8589934592 -- 2^33: indices a packed state holds
local PACKED_LIMIT = PACK_WINDOWS * PACK -- 2^53

-- Whether (win, count) is written packed.
local function fixed_packable(win, count)
  return type(win) ~= 'table' and win < PACK_WINDOWS and count < PACK
end

-- A state from its stored value (nil: absent) as index, count, whether the
-- key exists (with its window's expiry), and the count stored packed (an
-- INCRBY adds to it); nil for foreign data.
local function fixed_parse(v)
  if not v then
    return 0, 0
  end
  local x = tonumber(v)
  if x then
    -- Packed: a whole number below 2^53 (exact in a double), read as
    -- GCRA reads its tat (fixed_batch.lua reads it so too, inline).
    if x >= 0 and x % 1 == 0 and x < PACKED_LIMIT then
      local win = math.floor(x / PACK)
      return win, x - win * PACK, true, x - win * PACK
    end
    return nil
  end
  local w, c = string.match(v, '^(%d+):(%d+)$')
  local win, count = w and win_parse(w), stored_int(c, MAX_COUNT)
  if win and count then
    return win, count, true
  end
  return nil
end

-- The state of `key` for this batch, or nil and the error of foreign data:
-- a window after `now`'s (a clock that went back) is valid only with the
-- expiry every write sets; without one it would deny forever.
local function fixed_state(key, w, ns, now)
  local s, err = cached_state(fixed_states, key, fixed_parse, FIXED_WHAT)
  if s and win_lt((win_pos(now, w, ns)), s[1]) and not fixed_dirty[key] and persistent(key) then
    fixed_states[key] = nil
    return nil, foreign(key, 'a future window without expiry')
  end
  return s, err
end

-- The live window and its count at `now` from a stored state.
local function fixed_live(sw, sc, w, ns, now)
  local current = win_pos(now, w, ns)
  if not win_lt(sw, current) then
    return sw, sc
  end
  return current, 0
end

-- `kept`: the key holds window `win` already, and so its expiry;
-- `packed`: the count it holds packed, if it does.
local function fixed_write(key, now, w, ns, win, count, kept, packed)
  if count <= 0 then
    redis.call('DEL', key)
    return
  end
  local pack = fixed_packable(win, count)
  if kept and packed and pack then
    if count ~= packed then
      redis.call('INCRBY', key, int(count - packed))
    end
    return
  end
  local value
  if pack then
    value = int(win * PACK + count)
  else
    value = win_str(win) .. ':' .. int(count)
  end
  if kept then
    redis.call('SET', key, value, 'KEEPTTL')
  else
    redis.call('SET', key, value, 'PX', ttl_ms(win_until(now, w, ns, win_add(win, 1))))
  end
end

-- The state after admitting `count` units in window `win` on state `s`:
-- what Redis holds stays known while the window is the one it holds.
local function fixed_admitted(s, win, count)
  local kept = s[3] and win_eq(win, s[1])
  return { win, count, kept, kept and s[4] or nil }
end

local fixed_prefetch = string_state(fixed_states, fixed_dirty, fixed_parse, fixed_write)

-- The algorithm for windows in µs (ns = false) or ns (ns = true).
local function fixed_algo(ns)
  return {
    prefetch = fixed_prefetch,

    -- A single-rule check, straight into the batch reply `out` after index
    -- `n` (no closures or tables per check); returns the new length, or nil
    -- and an error.
    single = function(key, max, w, cost, now, out, n)
      local s, err = fixed_state(key, w, ns, now)
      if not s then
        return nil, err
      end
      local win, count = fixed_live(s[1], s[2], w, ns, now)
      local allowed = 0
      if count + cost <= max then
        allowed = 1
        if cost > 0 then
          local a = fixed_admitted(s, win, count + cost)
          fixed_states[key] = a
          fixed_dirty[key] = { w, ns, win, count + cost, a[3], a[4] }
        end
      end
      out[n + 1] = 1
      out[n + 2] = allowed
      out[n + 3] = win_reply(s[1])
      out[n + 4] = s[2]
      return n + 4
    end,

    check = function(key, max, w, cost, _, now)
      local s, err = fixed_state(key, w, ns, now)
      if not s then
        error({ err = err })
      end
      local win, count = fixed_live(s[1], s[2], w, ns, now)
      local allowed = count + cost <= max
      local commit = nil
      if allowed and cost > 0 then
        commit = function()
          local a = fixed_admitted(s, win, count + cost)
          fixed_states[key] = a
          fixed_dirty[key] = { w, ns, win, count + cost, a[3], a[4] }
        end
      end
      return allowed, { allowed and 1 or 0, win_reply(s[1]), s[2] }, commit
    end,

    -- Into the charge's own window while it is in force; an ended window
    -- keeps its count.
    refund = function(key, _, w, amount, now, receipt)
      local s, err = fixed_state(key, w, ns, now)
      if not s then
        error({ err = err })
      end
      local sw, sc = s[1], s[2]
      local win, count = fixed_live(sw, sc, w, ns, now)
      if win_eq(win, win_index_at(receipt.at, w, ns)) then
        fixed_write(key, now, w, ns, win, math.max(count - amount, 0))
      end
    end,
  }
end

algo.f = fixed_algo(false)
algo.f.ns = fixed_algo(true)
