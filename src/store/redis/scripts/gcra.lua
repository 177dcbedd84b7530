-- GCRA (redis-cell's CL.THROTTLE): one string, the theoretical arrival time.
-- p1 = T (emission interval, µs), p2 = tau (tolerance, µs).
-- The reply carries the stored tat; Rust renders the decision from it with
-- crate::algorithm::gcra::check, the same code the memory store runs.

local function gcra_tat(key)
  return tonumber(redis.call('GET', key)) or 0
end

algo.g = {
  check = function(key, t, tau, cost, _, now)
    local tat = gcra_tat(key)
    local new_tat = math.max(tat, now) + t * cost
    local allowed = new_tat <= now + tau
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        redis.call('SET', key, int(new_tat), 'PX', ttl_ms(new_tat - now))
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
