-- GCRA (redis-cell's CL.THROTTLE): one string, the theoretical arrival time.
-- p1 = T (emission interval, µs), p2 = tau (tolerance, µs).
-- The reply carries the stored tat; Rust renders the decision from it with
-- crate::algorithm::gcra::check, the same code the memory store runs.
--
-- Within one batch a key's tat is read once and kept in `gcra_tats`;
-- admissions update it there and the last value is written once, at the end
-- of the batch (`SET … PX`), which leaves the very state (and TTL) that
-- writing after every admission would.

local gcra_tats = {}
local gcra_dirty = {}

local function gcra_tat(key)
  local tat = gcra_tats[key]
  if tat == nil then
    tat = tonumber(redis.call('GET', key)) or 0
    gcra_tats[key] = tat
  end
  return tat
end

flush[#flush + 1] = function(now)
  for key, tat in pairs(gcra_dirty) do
    redis.call('SET', key, int(tat), 'PX', ttl_ms(tat - now))
  end
end

-- Reads the tats of `keys` (distinct) with one MGET. A nil (fresh key, or a
-- key of another type) is left for gcra_tat's GET, which raises WRONGTYPE.
local function gcra_prefetch(keys)
  local vals = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    local tat = tonumber(vals[i])
    if tat then
      gcra_tats[keys[i]] = tat
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
      tat = tonumber(v) or 0
      gcra_tats[key] = tat
    end
    local new_tat = math.max(tat, now) + t * cost
    local allowed = 0
    if new_tat <= now + tau then
      allowed = 1
      if cost > 0 then
        gcra_tats[key] = new_tat
        gcra_dirty[key] = new_tat
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
      redis.call('SET', key, int(back), 'PX', ttl_ms(back - now))
    end
  end,
}
