-- fixed_batch: a batch of single-rule fixed-window checks under ONE policy
-- (window in whole µs, code 'f') and cost, the common shape of a busy
-- batch. The check script's `U` mode (same arguments, same reply) in one
-- loop: a packed state is read and its admission written (one INCRBY of
-- the units) inline, and anything else — an absent key, a string state, a
-- key of another type, foreign data — goes through fixed_window.lua's
-- helpers, so every check decides exactly as its `single` would, in order
-- (the same key twice sees the first one's effect).
-- KEYS: one per check. ARGV[3] = '1', ARGV[4] = 'f', ARGV[5] = max,
-- ARGV[6] = window (µs), ARGV[7] = 'U', ARGV[8] = cost.
-- Reply: { now (µs), then per check: 1, allowed, stored window, stored
-- count; or 2 and the error of a check that failed alone }.

local now = now_us()
if ARGV[3] ~= '1' or ARGV[4] ~= 'f' or ARGV[7] ~= 'U' then
  error({ err = 'ERR tower-throttle: fixed_batch runs uniform µs fixed-window batches' })
end
local max, w, cost = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8])
local floor = math.floor
local out = { now }
local n = 1
local vals = redis.call('MGET', unpack(KEYS))
local current = fdiv(now, w)
-- Keys whose packed count grows by INCRBY at the end: the units to add.
local added = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local s, err = fixed_states[key], nil
  if s == nil then
    local v = vals[i]
    local x = v and tonumber(v)
    if x and x >= 0 and x % 1 == 0 and x < PACKED_LIMIT then
      -- Packed (fixed_parse, inline).
      do
        local win = floor(x / PACK)
        local count = x - win * PACK
        s = { win, count, true, count }
        fixed_states[key] = s
      end
    end
    if s == nil then
      s, err = cached_state(fixed_states, key, fixed_parse, FIXED_WHAT)
    end
  end
  -- A window after now's (a clock that went back) holds only with the
  -- expiry every write sets (fixed_state).
  if s and win_lt(current, s[1]) and not fixed_dirty[key] and not added[key] and persistent(key) then
    fixed_states[key] = nil
    s, err = nil, foreign(key, 'a future window without expiry')
  end
  if s then
    local sw, sc = s[1], s[2]
    local win, count = sw, sc
    if win_lt(sw, current) then
      win, count = current, 0
    end
    local allowed = 0
    if count + cost <= max then
      allowed = 1
      if cost > 0 then
        -- fixed_admitted, on the batch's own copy of the state.
        local kept = s[3] and win_eq(win, sw)
        local packed = kept and s[4] or nil
        s[1], s[2], s[3], s[4] = win, count + cost, kept, packed
        if packed and fixed_packable(win, count + cost) then
          -- Redis holds this window packed: the units go on by INCRBY.
          added[key] = count + cost - packed
        else
          added[key] = nil
          fixed_dirty[key] = { w, false, win, count + cost, kept, packed }
        end
      end
    end
    out[n + 1] = 1
    out[n + 2] = allowed
    out[n + 3] = win_reply(sw)
    out[n + 4] = sc
    n = n + 4
  else
    out[n + 1] = 2
    out[n + 2] = tostring(err)
    n = n + 2
  end
end
for key, units in pairs(added) do
  redis.call('INCRBY', key, units == cost and ARGV[8] or int(units))
end
return finish(now, out)
