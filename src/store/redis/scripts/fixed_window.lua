-- Fixed window: a hash { w = window index, c = count }.
-- p1 = max, p2 = window (µs). The reply carries the stored state; Rust
-- renders the decision with crate::algorithm::fixed_window::check.

local function fixed_state(key, w, now)
  local s = redis.call('HMGET', key, 'w', 'c')
  local sw, sc = tonumber(s[1]) or 0, tonumber(s[2]) or 0
  local current = fdiv(now, w)
  if sw >= current then
    return sw, sc, sw, sc
  end
  return sw, sc, current, 0
end

local function fixed_store(key, w, win, count, now)
  if count <= 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'w', int(win), 'c', int(count))
    redis.call('PEXPIRE', key, ttl_ms((win + 1) * w - now))
  end
end

algo.f = {
  check = function(key, max, w, cost, _, now)
    local sw, sc, win, count = fixed_state(key, w, now)
    local allowed = count + cost <= max
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        fixed_store(key, w, win, count + cost, now)
      end
    end
    return allowed, { allowed and 1 or 0, sw, sc }, commit
  end,

  refund = function(key, _, w, amount, now)
    if redis.call('EXISTS', key) == 0 then
      return
    end
    local _, _, win, count = fixed_state(key, w, now)
    fixed_store(key, w, win, math.max(count - amount, 0), now)
  end,
}
