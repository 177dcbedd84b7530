-- fixed_batch: a batch of single-rule fixed-window checks under ONE policy
-- (a window of whole µs) and cost, the common shape of a busy
-- batch. The check script's `U` mode arguments in one loop: a packed
-- state is read and its admission written (one INCRBY of the units)
-- inline, and anything else — an absent key, a string state, a key of
-- another type, foreign data — goes through fixed_window.lua's helpers, so
-- every check decides exactly as its `single` would, in order (the same
-- key twice sees the first one's effect).
-- KEYS: one per check. ARGV[3] = '1', ARGV[4] = 'f', ARGV[5] = max,
-- ARGV[6] = window (ns, whole µs), ARGV[7] = 'U', ARGV[8] = cost.
-- Reply: { now (µs), then per check one item }: 2·count + allowed, the
-- count the key holds in the window of `now` (the window Rust computes
-- from `now`; a past window's count is 0 there); for a state in a later
-- window (a clock that went back) { allowed, window, count }; or the error
-- message of a check that failed alone.

local now = now_us()
if ARGV[3] ~= '1' or ARGV[4] ~= 'f' or ARGV[7] ~= 'U' then
  error({ err = 'ERR tower-throttle: fixed_batch runs uniform µs fixed-window batches' })
end
local max, w, cost = tonumber(ARGV[5]), tonumber(ARGV[6]) / 1000, tonumber(ARGV[8])
local floor = math.floor
local out = { now }
local vals = redis.call('MGET', unpack(KEYS))
local current = fdiv(now, w)
-- Keys whose packed count grows by INCRBY at the end: the units to add.
local added = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  -- The state (sw, sc), whether Redis holds it (exists) and its packed
  -- count (stored); from this batch's earlier admissions first.
  local sw, sc, exists, stored, err
  local s = fixed_states[key]
  if s == nil then
    local v = vals[i]
    local x = v and tonumber(v)
    if x and x >= 0 and x % 1 == 0 and x < PACKED_LIMIT then
      -- Packed (as fixed_parse reads it), without a table.
      sw = floor(x / PACK)
      sc = x - sw * PACK
      exists, stored = true, sc
    else
      s, err = cached_state(fixed_states, key, fixed_parse, FIXED_WHAT)
    end
  end
  if s then
    sw, sc, exists, stored = s[1], s[2], s[3], s[4]
  end
  -- Indices are numbers here but for a state a window under 1 µs wrote in
  -- its index pairs: the window.lua comparisons then.
  local numeric = type(sw) == 'number'
  -- A window after now's (a clock that went back) holds only with the
  -- expiry every write sets (fixed_state).
  if sw ~= nil and (numeric and current < sw or not numeric and win_lt(current, sw))
    and not fixed_dirty[key] and not added[key] and persistent(key) then
    fixed_states[key] = nil
    sw, err = nil, foreign(key, 'a future window without expiry')
  end
  if sw ~= nil then
    local win, count = sw, sc
    if numeric and sw < current or not numeric and win_lt(sw, current) then
      win, count = current, 0
    end
    local allowed = 0
    if count + cost <= max then
      allowed = 1
      if cost > 0 then
        -- fixed_admitted: Redis holds the window still, or not.
        local kept = exists and (numeric and win == sw or not numeric and win_eq(win, sw))
        local packed = kept and stored or nil
        local total = count + cost
        fixed_states[key] = { win, total, kept, packed }
        if packed and numeric and win < PACK_WINDOWS and total < PACK then
          -- Redis holds this window packed: the units go on by INCRBY.
          added[key] = total - packed
        else
          added[key] = nil
          fixed_dirty[key] = { w, false, win, total, kept, packed }
        end
      end
    end
    if numeric and sw == current then
      out[i + 1] = 2 * sc + allowed
    elseif numeric and sw < current then
      out[i + 1] = allowed
    else
      out[i + 1] = { allowed, win_reply(sw), sc }
    end
  else
    out[i + 1] = tostring(err)
  end
end
for key, units in pairs(added) do
  redis.call('INCRBY', key, units == cost and ARGV[8] or int(units))
end
return finish(now, out)
