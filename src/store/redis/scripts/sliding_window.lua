-- Sliding-window counter: a hash { w = window index, c = current, p = previous }.
-- p1 = max, p2 = window (µs). Admission compares integers scaled by the
-- window (prev*(w - elapsed) + cur*w + cost*w <= max*w); Rust guarantees
-- (3*max + 1)*w < 2^53 so every product is exact. The reply carries the
-- stored state; Rust renders the decision with
-- crate::algorithm::sliding_window::check (its retry_after divides, which is
-- not scale-free between µs and ns, so it is computed there, in ns).

local function sliding_state(key, w, now)
  local s = redis.call('HMGET', key, 'w', 'c', 'p')
  local sw, sc, sp = tonumber(s[1]) or 0, tonumber(s[2]) or 0, tonumber(s[3]) or 0
  local index = fdiv(now, w)
  local win, cur, prev = sw, sc, sp
  if sw < index then
    if sw + 1 == index then
      win, cur, prev = index, 0, sc
    else
      win, cur, prev = index, 0, 0
    end
  end
  local elapsed = now - win * w
  if elapsed < 0 then
    elapsed = 0
  elseif elapsed > w then
    elapsed = w
  end
  return { sw, sc, sp }, win, cur, prev, elapsed
end

local function sliding_store(key, w, win, cur, prev, now)
  local left = 0
  if cur > 0 then
    left = 2
  elseif prev > 0 then
    left = 1
  end
  if left == 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'w', int(win), 'c', int(cur), 'p', int(prev))
    redis.call('PEXPIRE', key, ttl_ms((win + left) * w - now))
  end
end

algo.s = {
  check = function(key, max, w, cost, _, now)
    local raw, win, cur, prev, elapsed = sliding_state(key, w, now)
    local used = prev * (w - elapsed) + cur * w
    local allowed = used + cost * w <= max * w
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        sliding_store(key, w, win, cur + cost, prev, now)
      end
    end
    return allowed, { allowed and 1 or 0, raw[1], raw[2], raw[3] }, commit
  end,

  refund = function(key, _, w, amount, now)
    if redis.call('EXISTS', key) == 0 then
      return
    end
    local _, win, cur, prev = sliding_state(key, w, now)
    sliding_store(key, w, win, math.max(cur - amount, 0), prev, now)
  end,
}
