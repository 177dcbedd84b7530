-- tower-throttle: helpers shared by every script (this file is prepended).
--
-- Times are integer MICROSECONDS held in Lua numbers (doubles): exact below
-- 2^53. The Rust side rejects policies whose products could reach that bound,
-- and numbers are always written with int() (never tostring, which rounds).
--
-- ARGV[1] = now in µs, or '' to read the server's TIME (production).
-- ARGV[2] = extra milliseconds added to every TTL (0 in production).

local LIMIT = 4503599627370496 -- 2^52: `now` must stay below it

-- Lua 5.1 (Redis, Valkey) has the global `unpack`; 5.2+ engines (Valkey's
-- optional engine, Dragonfly, Garnet) only `table.unpack`. Every script
-- calls this alias (a test in registry/tests.rs keeps it so).
local unpack = table.unpack or unpack

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

-- A duration parameter in ns: a number where it is exact, else (a duration
-- of 2^53 ns, 104 days, or more) the exact pair { µs, ns remainder } cut
-- from its decimal digits.
local str_sub = string.sub

-- A decimal string of ns as the exact pair (µs, ns remainder).
local function ns_split(v)
  local n = #v
  if n <= 3 then
    return 0, tonumber(v)
  end
  return tonumber(str_sub(v, 1, n - 3)), tonumber(str_sub(v, n - 2))
end

local function dur_param(v)
  local x = tonumber(v)
  if x and x < 9007199254740992 then
    return x
  end
  return { ns_split(v) }
end

-- A duration from dur_param as (whole µs, ns remainder), exactly.
local function dur_split(w)
  if type(w) == 'table' then
    return w[1], w[2]
  end
  local q = fdiv(w, 1000)
  return q, w - 1000 * q
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

-- The script's now, once now_us has read it (every script calls it first).
local script_now = nil

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
  script_now = now
  return now
end

-- Every algorithm registers { check = ..., refund = ... } here under its code.
--   check(key, p1, p2, cost, permit, now) -> allowed, reply, commit-or-nil
--   refund(key, p1, p2, amount, now)
-- An algorithm whose duration runs in µs where it is whole µs (below 2^53
-- ns, so exact) and in ns otherwise keeps its ns form in `ns`.
local algo = {}

-- The parameters of a policy as sent (p1, a count; p2, a duration in ns):
-- the form of algorithm `a` that runs them, and the parameters it takes
-- (the µs form a duration in µs, the ns form what dur_param reads).
local function pick(a, p1, p2)
  local d = tonumber(p2)
  if a.ns == nil then
    return a, tonumber(p1), d
  elseif d and d < 9007199254740992 and d % 1000 == 0 then
    return a, tonumber(p1), d / 1000
  end
  return a.ns, tonumber(p1), dur_param(p2)
end

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

-- Data this crate never writes at one of its keys (another program wrote
-- there): the key is deleted, so the next check finds it fresh and nobody
-- stays locked out, and the check fails alone with an error naming the key,
-- which Rust reports as StoreError::ForeignData and logs.
local function foreign(key, what)
  redis.call('DEL', key)
  return 'FOREIGN ' .. what .. ' at ' .. key
end

-- The message of an error raised by a Redis call on `key` (a table in
-- Redis 7, a string before); a key of another type is foreign data.
local function call_error(key, err)
  if type(err) == 'table' then
    err = err.err or 'error'
  end
  err = tostring(err)
  if string.find(err, 'WRONGTYPE', 1, true) then
    return foreign(key, 'a value of another type')
  end
  return err
end

-- A number this crate stores: digits only (the caller's pattern), exact,
-- and at most `max`; nil for anything else.
local function stored_int(digits, max)
  local x = tonumber(digits)
  if x and x <= max then
    return x
  end
  return nil
end

-- Whether `key` has no expiry. Every key this crate writes has one, so
-- state that would deny in the future (a window or a time after `now`)
-- without an expiry was written by another program: it would never lapse.
local function persistent(key)
  return redis.call('PTTL', key) == -1
end

-- For algorithms whose state is one string read into a table by `parse`
-- (nil first for a value that is no state of theirs, described by `what`):
-- the state of `key` kept in `states` for this batch, or read now; nil and
-- the error for foreign data, which is deleted.
local function cached_state(states, key, parse, what)
  local s = states[key]
  if s == nil then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then
      return nil, call_error(key, v.err)
    end
    s = { parse(v) }
    if s[1] == nil then
      return nil, foreign(key, what)
    end
    states[key] = s
  end
  return s
end

-- Reads the states of `keys` with one MGET. A false (absent, or a key of
-- another type) or a value that is no state is left for cached_state's
-- GET, which reports it.
local function prefetch_states(states, keys, parse)
  local vals = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    if vals[i] then
      local s = { parse(vals[i]) }
      if s[1] ~= nil then
        states[keys[i]] = s
      end
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
