-- check: a BATCH of checks, evaluated in order, exactly as if they ran one
-- after another (the same key twice sees the first one's effect). Each check
-- decides every one of its rules, then commits them only if all allow.
-- KEYS: every rule's key, check after check (all in one slot on a cluster).
-- ARGV[3] = number of checks; then, per check, its rule count n followed by
-- n × (algorithm code, p1, p2, cost, permit id).
-- Reply (flat): { now (µs), then per check: 1 and its rules' fields, or 2 and
-- an error message }. A failing check (a key of another type) fails alone.
-- When a rule denies, nothing is charged and the rules that would have passed
-- report a peek (their check at cost 0), as the Store trait specifies.

local now = now_us()
local out = { now }
local n_out = 1

local function run(k, b, cost)
  local a = algo[ARGV[b]]
  if not a then
    error('tower-throttle: unknown algorithm')
  end
  return a.check(KEYS[k], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), cost, ARGV[b + 4], now)
end

-- One check of n rules: keys from k, arguments from b. Returns the replies.
local function one(k, b, n)
  if n == 1 then
    local _, reply, commit = run(k, b, tonumber(ARGV[b + 3]))
    if commit then
      commit()
    end
    return reply
  end
  local replies, commits, passed = {}, {}, {}
  local all = true
  for i = 1, n do
    local bi = b + (i - 1) * 5
    local ok, reply, commit = run(k + i - 1, bi, tonumber(ARGV[bi + 3]))
    all = all and ok
    passed[i] = ok
    replies[i] = reply
    commits[i] = commit
  end
  if not all then
    for i = 1, n do
      if passed[i] then
        local _, reply = run(k + i - 1, b + (i - 1) * 5, 0)
        replies[i] = reply
      end
    end
  else
    for i = 1, n do
      if commits[i] then
        commits[i]()
      end
    end
  end
  local flat = {}
  for i = 1, n do
    for _, x in ipairs(replies[i]) do
      flat[#flat + 1] = x
    end
  end
  return flat
end

local k, b = 1, 4
for _ = 1, tonumber(ARGV[3]) do
  local n = tonumber(ARGV[b])
  b = b + 1
  local ok, reply = pcall(one, k, b, n)
  if ok then
    n_out = n_out + 1
    out[n_out] = 1
    for i = 1, #reply do
      out[n_out + i] = reply[i]
    end
    n_out = n_out + #reply
  else
    if type(reply) == 'table' then
      reply = reply.err or 'error'
    end
    out[n_out + 1] = 2
    out[n_out + 2] = tostring(reply)
    n_out = n_out + 2
  end
  k = k + n
  b = b + 5 * n
end
for i = 1, #flush do
  flush[i](now)
end
return out
