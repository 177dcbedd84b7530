-- tower-throttle: helpers shared by every script (this file is prepended).
--
-- Times are integer MICROSECONDS held in Lua numbers (doubles): exact below
-- 2^53. The Rust side rejects policies whose products could reach that bound,
-- and numbers are always written with int() (never tostring, which rounds).
--
-- ARGV[1] = now in µs, or '' to read the server's TIME (production).
-- ARGV[2] = extra milliseconds added to every TTL (0 in production).

local LIMIT = 4503599627370496 -- 2^52: `now` must stay below it

-- '%d' formats through a C long: exact and several times cheaper than
-- '%.0f' where long has 64 bits (checked once per call; every number given
-- to int() is already an integer).
local INT_FORMAT = '%.0f'
if string.format('%d', 4503599627370497) == '4503599627370497' then
  INT_FORMAT = '%d'
end

local function int(x)
  return string.format(INT_FORMAT, x)
end

-- floor(a / b) for non-negative integers, exact even where a / b rounds.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local PAD_MS = tonumber(ARGV[2]) or 0

-- PEXPIRE argument for state that must live `us` more microseconds:
-- whole milliseconds rounded up (never shorter than needed), at least 1.
local function ttl_ms(us)
  local ms = fdiv(us + 999, 1000)
  if ms < 1 then
    ms = 1
  end
  return int(ms + PAD_MS)
end

local function now_us()
  local now
  if ARGV[1] ~= '' then
    now = tonumber(ARGV[1])
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  if not now or now < 0 or now >= LIMIT then
    error({ err = 'ERR tower-throttle: time out of range' })
  end
  return now
end

-- Every algorithm registers { check = ..., refund = ... } here under its code.
--   check(key, p1, p2, cost, permit, now) -> allowed, reply, commit-or-nil
--   refund(key, p1, p2, amount, now)
local algo = {}
-- Functions run once at the end of a check batch, after every check: write
-- back state an algorithm kept in a table during the batch.
local flush = {}

-- Ends a check batch: runs the flushes, then hands back the reply.
local function finish(now, out)
  for i = 1, #flush do
    flush[i](now)
  end
  return out
end

-- For algorithms whose state is one string read into a table by `parse`:
-- the state of `key` kept in `states` for this batch, or read now; nil and
-- the error for a key of another type.
local function cached_state(states, key, parse)
  local s = states[key]
  if s == nil then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then
      return nil, v.err
    end
    s = { parse(v) }
    states[key] = s
  end
  return s
end

-- Reads the states of `keys` with one MGET. A false (absent, or a key of
-- another type) is left for cached_state's GET, which reports the type.
local function prefetch_states(states, keys, parse)
  local vals = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    if vals[i] then
      states[keys[i]] = { parse(vals[i]) }
    end
  end
end

-- Sets up an algorithm whose state is one string per key: its changed
-- states (`dirty[key] = { ... }`) are written once at the end of the batch
-- by `write(key, now, ...)`. Returns its prefetch.
local function string_state(states, dirty, parse, write)
  flush[#flush + 1] = function(now)
    for key, d in pairs(dirty) do
      write(key, now, unpack(d))
    end
  end
  return function(keys)
    prefetch_states(states, keys, parse)
  end
end

-- cached_state for code that raises (a multi-rule check's pcall reports it).
local function state_or_raise(states, key, parse)
  local s, err = cached_state(states, key, parse)
  if not s then
    error({ err = err })
  end
  return s
end
