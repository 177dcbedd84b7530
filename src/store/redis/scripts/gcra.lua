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
-- The tat each key held in Redis when the batch began (absent: nil).
local gcra_stored = {}
local gcra_dirty = {}

local function gcra_read(key, v)
  local tat = tonumber(v)
  gcra_stored[key] = tat
  tat = tat or 0
  gcra_tats[key] = tat
  return tat
end

local function gcra_tat(key)
  local tat = gcra_tats[key]
  if tat == nil then
    tat = gcra_read(key, redis.call('GET', key))
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
-- another type) is left for gcra_tat's GET, which raises WRONGTYPE.
local function gcra_prefetch(keys)
  local vals = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    if vals[i] then
      gcra_read(keys[i], vals[i])
    end
  end
end

algo.g = {
  prefetch = gcra_prefetch,

  -- A single-rule check, straight into the batch reply `out` after index
  -- `n`; returns the new length, or nil and an error.
  single = function(key, t, tau, cost, now, out, n)
    local tat = gcra_tats[key]
    if tat == nil then
      local v = redis.pcall('GET', key)
      if type(v) == 'table' and v.err then
        return nil, v.err
      end
      tat = gcra_read(key, v)
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
    local tat = gcra_tat(key)
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

  refund = function(key, t, _, amount, now)
    local tat = gcra_tat(key)
    local back = math.max(tat - t * amount, now)
    if back <= now then
      redis.call('DEL', key)
    else
      -- Written whole: the expiry moves back to the refunded tat's.
      gcra_write(key, nil, back, now)
    end
  end,
}
