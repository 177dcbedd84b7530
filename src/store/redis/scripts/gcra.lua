-- GCRA (redis-cell's CL.THROTTLE): one integer per key, the theoretical
-- arrival time (tat), in NANOSECONDS like T (p1, the emission interval) and
-- tau (p2, the tolerance). The reply carries the tat as its offset from now;
-- Rust renders the decision from it with crate::algorithm::gcra::check, the
-- same code the memory store runs.
--
-- Lua numbers are doubles, exact below 2^53, and ns since the epoch (about
-- 1.8·10^18) are not. So a tat is stored modulo the wrap, 1000·2^43 ns
-- (102 days, below 2^53), and read as its offset from now, taken within
-- half of that (51 days) either way: exact, and unambiguous because a live
-- tat is never further from now. Rust refuses policies whose tau reaches
-- 1000·2^42 ns, so a tat is at most tau ahead; and a key expires at most a
-- second after its tat (below), so it is never stale by more than that and
-- its TTL padding. A cost whose T·cost exceeds tau is denied before it is
-- added: every sum stays below 2^53, exact.
--
-- Within one batch a key's offset is read once and kept in `gcra_d`;
-- admissions update it there and the last value is written once, at the end
-- of the batch.
--
-- The write is the one cost a script cannot avoid per admitted key, so it
-- is the cheapest Redis offers: an INCRBY of the change (in place, keeping
-- the TTL; a SET … PX replaces the value and costs about three times as
-- much), and a PEXPIRE only when the expiry must move. A key expires at its
-- tat rounded up to the next whole second: never before its state is fresh
-- again, at most a second after. Every writer keeps that invariant, so from
-- a stored tat alone the script knows whether the key's expiry still covers
-- a new one: a key admitted faster than once a second gets one PEXPIRE a
-- second, not one per admission.

-- Constants are literals, not locals: every script call creates this
-- file's closures, and each local a closure names costs it an upvalue.
--   8796093022208000 ns = 1000·2^43 (the wrap), 8796093022208 µs = 2^43,
--   4398046511104000 ns = half the wrap; -4398046511104000, the offset of a
--   fresh key: long past, so its tat counts as now.

local pcall_redis, call_redis, type_of = redis.pcall, redis.call, type

-- The script's now (whole µs, below 2^52) in ns modulo the wrap (exact:
-- a power of two divides a µs number exactly), and its ns into the current
-- second; set by gcra_clock.
local gcra_nowm, gcra_frac = nil, nil
local function gcra_clock(now)
  if gcra_nowm == nil then
    gcra_nowm = (now % 8796093022208) * 1000
    gcra_frac = (now % 1000000) * 1000
  end
end

-- Per batch: each key's offset from now (read, then as admissions move
-- it), the value Redis held when the batch read it (nil: absent), and the
-- keys to write back.
local gcra_d, gcra_stored, gcra_dirty = {}, {}, {}

-- The offset from now of a stored value `x` (below the wrap), taken
-- within half the wrap either way.
local function gcra_offset(x)
  local d = x - gcra_nowm
  if d >= 4398046511104000 then
    return d - 8796093022208000
  elseif d < -4398046511104000 then
    return d + 8796093022208000
  end
  return d
end

-- The offset of stored value `v` (nil or false: absent), kept for the
-- batch. A value this crate never writes ("abc", "-5", "1e30", "1.5") is
-- deleted and its error returned after nil; `prefetching`, it is left for
-- the check to report.
local function gcra_read(key, v, prefetching)
  if not v then
    gcra_stored[key], gcra_d[key] = nil, -4398046511104000
    return -4398046511104000
  end
  local x = tonumber(v)
  if not (x and x >= 0 and x < 8796093022208000 and x % 1 == 0) then
    if prefetching then
      return nil
    end
    return nil, foreign(key, 'a value that is no tat')
  end
  local d = gcra_offset(x)
  gcra_stored[key], gcra_d[key] = x, d
  return d
end

-- The offset of `key`, or nil and an error (another type, foreign data).
local function gcra_tat(key)
  local d = gcra_d[key]
  if d then
    return d
  end
  local v = pcall_redis('GET', key)
  if type_of(v) == 'table' and v.err then
    return nil, call_error(key, v.err)
  end
  return gcra_read(key, v)
end

-- Reads the values of `keys` with one MGET. A false (absent, or a key of
-- another type) is left for gcra_tat's GET, which reports WRONGTYPE; a
-- foreign value is left for it too, to fail its own check.
local function gcra_prefetch(keys)
  gcra_clock(script_now)
  local vals = call_redis('MGET', unpack(keys))
  for i = 1, #keys do
    if vals[i] and gcra_d[keys[i]] == nil then
      gcra_read(keys[i], vals[i], true)
    end
  end
end

local floor = math.floor

-- The whole second a tat `d` ns after now rounds up to, counted from the
-- second now is in. The sum is exact (below 2^53 in magnitude), and a
-- correctly rounded quotient is never below the true one's floor, so one
-- correction downwards makes the floor exact.
local function gcra_second(d)
  local n = gcra_frac + d + 999999999
  local q = floor(n / 1000000000)
  if q * 1000000000 > n then
    q = q - 1
  end
  return q
end

-- Stores the tat `d` ns after now (0 <= d < half the wrap) for `key`,
-- keeping the expiry invariant above: an INCRBY of the change where the
-- batch read a value (`step_str`: the change formatted, when it is `step`),
-- else a SET. The value is now + d modulo the wrap, without a sum past
-- 2^53 (which doubles would round).
local function gcra_write(key, d, step, step_str)
  local room, value = 8796093022208000 - gcra_nowm, nil
  if d >= room then
    value = d - room
  else
    value = gcra_nowm + d
  end
  local stored = gcra_stored[key]
  if stored then
    local change = value - stored
    -- pcall: a value INCRBY cannot parse (never written by this crate) is
    -- replaced whole instead of failing the batch.
    local r = pcall_redis('INCRBY', key, change == step and step_str or int(change))
    -- The expiry moves once the tat passes the second the stored one
    -- rounded up to.
    if type_of(r) ~= 'table' then
      if d > gcra_second(gcra_offset(stored)) * 1000000000 - gcra_frac then
        call_redis('PEXPIRE', key, ttl_ms(gcra_second(d) * 1000000 - gcra_frac / 1000))
      end
      return
    end
  end
  call_redis('SET', key, int(value), 'PX', ttl_ms(gcra_second(d) * 1000000 - gcra_frac / 1000))
end

-- The batch's admissions move a tat that is still ahead of now (a busy
-- key) by `gcra_step` ns: formatted once for all of them.
local gcra_step = nil

flush[#flush + 1] = function()
  local step, step_str = gcra_step, gcra_step and int(gcra_step)
  for key, d in pairs(gcra_dirty) do
    gcra_write(key, d, step, step_str)
  end
end

-- A check admits `cost` units when T·cost = `inc` fits in tau and the tat,
-- counted as now when it is past (`base`, the offset the reply carries),
-- plus inc is at most tau ahead of now.

algo.g = {
  prefetch = gcra_prefetch,

  -- A single-rule check, straight into the batch reply `out` after index
  -- `n`; returns the new length, or nil and an error.
  single = function(key, t, tau, cost, now, out, n)
    gcra_clock(now)
    local d, err = gcra_d[key], nil
    if d == nil then
      d, err = gcra_tat(key)
      if not d then
        return nil, err
      end
    end
    local inc = t * cost
    local base = d > 0 and d or 0
    local new_d = base + inc
    local allowed = 0
    if inc <= tau and new_d <= tau then
      allowed = 1
      if cost > 0 then
        gcra_d[key], gcra_dirty[key], gcra_step = new_d, new_d, inc
      end
    end
    out[n + 1] = 1
    out[n + 2] = allowed
    out[n + 3] = base
    return n + 3
  end,

  check = function(key, t, tau, cost, _, now)
    gcra_clock(now)
    local d, err = gcra_tat(key)
    if not d then
      error({ err = err })
    end
    local inc = t * cost
    local base = d > 0 and d or 0
    local new_d = base + inc
    local allowed = inc <= tau and new_d <= tau
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        gcra_d[key], gcra_dirty[key], gcra_step = new_d, new_d, inc
      end
    end
    return allowed, { allowed and 1 or 0, base }, commit
  end,

  -- Back by the charge's debt less the time since it was taken (see
  -- crate::algorithm::gcra::refund), never before now. Rust bounds the
  -- amount by limit + 1, so T·amount is at most tau + T, below 2^43 µs: a
  -- receipt held that long or longer owes nothing.
  refund = function(key, t, _, amount, now, receipt)
    gcra_clock(now)
    local d, err = gcra_tat(key)
    if not d then
      error({ err = err })
    end
    local held = math.min(math.max(now - receipt.at, 0), 8796093022208) * 1000
    local back = d - math.max(t * amount - held, 0)
    if back <= 0 then
      redis.call('DEL', key)
    else
      -- Written whole: the expiry moves back to the refunded tat's.
      gcra_stored[key] = nil
      gcra_write(key, back)
    end
  end,
}
