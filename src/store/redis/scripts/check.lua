-- check: decides every rule, then commits all of them only if all allow.
-- KEYS[i] = rule i's key (all in one hash slot on a cluster).
-- ARGV[3 + 5(i-1) ..] = algorithm code, p1, p2, cost, permit id.
-- Reply: { now (µs), reply of rule 1, reply of rule 2, ... }. When a rule
-- denies, nothing is charged and the rules that would have passed report a
-- peek (their check at cost 0), as the Store trait specifies.

local now = now_us()
local out = { now }
local commits = {}
local passed = {}
local all = true

local function run(i, cost)
  local b = 2 + (i - 1) * 5
  local a = algo[ARGV[b + 1]]
  if not a then
    error({ err = 'ERR tower-throttle: unknown algorithm' })
  end
  return a.check(KEYS[i], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), cost, ARGV[b + 5], now)
end

for i = 1, #KEYS do
  local ok, reply, commit = run(i, tonumber(ARGV[2 + (i - 1) * 5 + 4]))
  all = all and ok
  passed[i] = ok
  out[i + 1] = reply
  commits[i] = commit
end
if not all then
  for i = 1, #KEYS do
    if passed[i] then
      local _, reply = run(i, 0)
      out[i + 1] = reply
    end
  end
else
  for i = 1, #KEYS do
    if commits[i] then
      commits[i]()
    end
  end
end
return out
