-- GCRA (redis-cell's CL.THROTTLE): one string, the theoretical arrival time.
-- p1 = T (emission interval, µs), p2 = tau (tolerance, µs).
-- The reply carries the stored tat; Rust renders the decision from it with
-- crate::algorithm::gcra::check, the same code the memory store runs.
--
-- Within one batch a key's tat is read once and kept in `gcra_tats`;
-- admissions update it there and the last value is written once, at the end
-- of the batch.
--
-- The write is the one cost a script cannot avoid per admitted key, so it
-- is the cheapest Redis offers: an INCRBY of the change (in place, keeping
-- the TTL; a SET … PX replaces the value and costs about three times as
-- much), and a PEXPIRE only when the expiry must move. A key expires at its
-- tat rounded up to the next whole second (GCRA_EXPIRY_STEP): never before
-- its state is fresh again, at most a second after. Every writer keeps that
-- invariant, so from a stored tat alone the script knows whether the key's
-- expiry still covers a new one: a key admitted faster than once a second
-- gets one PEXPIRE a second, not one per admission.

local GCRA_EXPIRY_STEP = 1000000 -- µs

-- Where a key holding `tat` expires (µs, the script's clock): `tat` rounded
-- up to a multiple of the step. Lua's % is a - floor(a / b) * b, exact here:
-- tat stays below 2^52 + 2^50 (now < 2^52, plus at most tau), where doubles
-- hold integers exactly, and the step divides it exactly when it is a
-- multiple.
local function gcra_expiry(tat)
  return tat + (-tat) % GCRA_EXPIRY_STEP
end

local gcra_tats = {}
-- The tat each key held in Redis when the batch began (absent: nil), when
-- an INCRBY of the change can update it in place.
local gcra_stored = {}
local gcra_dirty = {}

-- Stored tats are µs integers below 2^52 + 2^50, or (gcra_ns.lua) 2.4·10^18
-- plus a tat in ns, below 8.1·10^18. Anything else — "abc", "-5", "1e30", a
-- fraction — was written by another program: gcra_valid gives nil.
local function gcra_valid(v)
  local x = tonumber(v)
  if x and x >= 0 and x % 1 == 0 and (x < 5.7e15 or (x >= 2.4e18 and x < 8.1e18)) then
    return x
  end
  return nil
end

-- Data this crate never writes at one of its keys: the key is deleted (so
-- the next check finds it fresh: nobody stays locked out) and the check
-- fails alone with an error naming the key, which Rust reports as
-- StoreError::ForeignData and logs.
local function gcra_foreign(key, what)
  redis.call('DEL', key)
  return 'FOREIGN ' .. what .. ' at ' .. key
end

local function gcra_type_error(key, err)
  if string.find(err, 'WRONGTYPE', 1, true) then
    return gcra_foreign(key, 'a value of another type')
  end
  return err
end

-- The tat of a stored value `v` (nil: absent) for the µs path, or nil and
-- the error of foreign data.
local function gcra_read(key, v)
  if not v then
    gcra_stored[key] = nil
    gcra_tats[key] = 0
    return 0
  end
  local tat = gcra_valid(v)
  if not tat then
    return nil, gcra_foreign(key, 'a value that is no tat')
  end
  if tat >= 2.4e18 then
    -- Written at ns precision by a policy whose interval is not whole µs:
    -- read exactly, rounded up to the µs (never earlier), and written back
    -- whole.
    local n = #v
    tat = tonumber(string.sub(v, 1, n - 3)) - 2400000000000000
    if tonumber(string.sub(v, n - 2)) > 0 then
      tat = tat + 1
    end
    gcra_stored[key] = nil
  else
    gcra_stored[key] = tat
  end
  gcra_tats[key] = tat
  return tat
end

-- The tat of `key`, or nil and an error (another type, foreign data).
local function gcra_tat(key)
  local tat = gcra_tats[key]
  if tat == nil then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then
      return nil, gcra_type_error(key, v.err)
    end
    return gcra_read(key, v)
  end
  return tat
end

local pcall_redis, call_redis, type_of = redis.pcall, redis.call, type

-- Stores `tat` for `key`, which held `stored` (nil: absent), keeping the
-- expiry invariant above. `by` is the change as a string, when known.
local function gcra_write(key, stored, tat, now, by)
  if stored then
    -- pcall: a value INCRBY cannot parse (never written by this crate) is
    -- replaced whole instead of failing the batch.
    local r = pcall_redis('INCRBY', key, by or int(tat - stored))
    if type_of(r) ~= 'table' then
      local expiry = gcra_expiry(tat)
      if expiry > gcra_expiry(stored) then
        call_redis('PEXPIRE', key, ttl_ms(expiry - now))
      end
      return
    end
  end
  call_redis('SET', key, int(tat), 'PX', ttl_ms(gcra_expiry(tat) - now))
end

-- The batch's admissions add `gcra_step` µs to a tat that is still ahead
-- of now (a busy key): formatted once for all of them.
local gcra_step = nil

flush[#flush + 1] = function(now)
  local step, step_str = gcra_step, gcra_step and int(gcra_step)
  for key, tat in pairs(gcra_dirty) do
    local stored = gcra_stored[key]
    gcra_write(key, stored, tat, now, stored and tat - stored == step and step_str)
  end
end

-- Reads the tats of `keys` with one MGET. A nil (fresh key, or a key of
-- another type) is left for gcra_tat's GET, which reports WRONGTYPE; a
-- foreign value is left for it too (gcra_valid: nil), to fail its check.
local function gcra_prefetch(keys)
  local vals = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    local v = vals[i]
    if v and gcra_valid(v) then
      gcra_read(keys[i], v)
    end
  end
end

algo.g = {
  prefetch = gcra_prefetch,

  -- A single-rule check, straight into the batch reply `out` after index
  -- `n`; returns the new length, or nil and an error.
  single = function(key, t, tau, cost, now, out, n)
    local tat, err = gcra_tats[key], nil
    if tat == nil then
      tat, err = gcra_tat(key)
      if not tat then
        return nil, err
      end
    end
    local new_tat = math.max(tat, now) + t * cost
    local allowed = 0
    if new_tat <= now + tau then
      allowed = 1
      if cost > 0 then
        gcra_tats[key] = new_tat
        gcra_dirty[key] = new_tat
        gcra_step = t * cost
      end
    end
    out[n + 1] = 1
    out[n + 2] = allowed
    out[n + 3] = tat
    return n + 3
  end,

  check = function(key, t, tau, cost, _, now)
    local tat, err = gcra_tat(key)
    if not tat then
      error({ err = err })
    end
    local new_tat = math.max(tat, now) + t * cost
    local allowed = new_tat <= now + tau
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        gcra_tats[key] = new_tat
        gcra_dirty[key] = new_tat
        gcra_step = t * cost
      end
    end
    return allowed, { allowed and 1 or 0, tat }, commit
  end,

  -- Back by the charge's debt less the time since it was taken (see
  -- crate::algorithm::gcra::refund), never before now.
  refund = function(key, t, _, amount, now, receipt)
    local tat, err = gcra_tat(key)
    if not tat then
      error({ err = err })
    end
    local owed = math.max(t * amount - math.max(now - receipt.at, 0), 0)
    local back = math.max(tat - owed, now)
    if back <= now then
      redis.call('DEL', key)
    else
      -- Written whole: the expiry moves back to the refunded tat's.
      gcra_write(key, nil, back, now)
    end
  end,
}
