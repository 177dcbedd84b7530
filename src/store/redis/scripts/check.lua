-- check: a BATCH of checks, evaluated in order, exactly as if they ran one
-- after another (the same key twice sees the first one's effect). Each check
-- decides every one of its rules, then commits them only if all allow.
-- KEYS: every rule's key, check after check (all in one slot on a cluster).
-- ARGV[3] = number of policies P, then P × (algorithm code, p1 a count, p2 a
-- duration in ns);
-- then the number of checks, and per check its rule count n followed by
-- n × (policy index, cost[, permit id if the policy is a concurrency one]);
-- or, for a uniform batch, 'U' and the cost (see below).
-- Reply (flat): { now (µs), then per check: 1 and its rules' fields, or 2 and
-- an error message }. A failing check (a key of another type) fails alone.
-- When a rule denies, nothing is charged and the rules that would have passed
-- report a peek (their check at cost 0), as the Store trait specifies.

local now = now_us()
local out = { now }
local n_out = 1

local n_pol = tonumber(ARGV[3])
local pol_a, pol_1, pol_2, pol_c = {}, {}, {}, {}
for i = 1, n_pol do
  local b = 1 + 3 * i
  local a = algo[ARGV[b]]
  if not a then
    error({ err = 'ERR tower-throttle: unknown algorithm' })
  end
  pol_c[i] = ARGV[b] == 'c'
  pol_a[i], pol_1[i], pol_2[i] = pick(a, ARGV[b + 1], ARGV[b + 2])
end

-- Rule i of a check: its key, policy index and cost, permit.
local rule_key, rule_pol, rule_cost, rule_permit = {}, {}, {}, {}

-- One check of n rules (already read into the rule_* tables). Returns the
-- replies' fields.
local function one(n)
  local replies, commits, passed = {}, {}, {}
  local all = true
  local function run(i, cost)
    local p = rule_pol[i]
    return pol_a[p].check(rule_key[i], pol_1[p], pol_2[p], cost, rule_permit[i], now)
  end
  for i = 1, n do
    local ok, reply, commit = run(i, rule_cost[i])
    all = all and ok
    passed[i] = ok
    replies[i] = reply
    commits[i] = commit
  end
  if not all then
    for i = 1, n do
      if passed[i] then
        local _, reply = run(i, 0)
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

-- A check that failed alone (a key of another type): status 2 and why.
local function fail(why)
  out[n_out + 1] = 2
  out[n_out + 2] = tostring(why)
  n_out = n_out + 2
end

-- Runs an algorithm's single-rule fast path into the reply.
local function run_single(single, key, p1, p2, cost)
  local len, err = single(key, p1, p2, cost, now, out, n_out)
  if len then
    n_out = len
  else
    fail(err)
  end
end

-- A uniform batch ('U', then the cost): every key is one single-rule check
-- of policy 1 at that cost, for an algorithm with a `single` fast path.
if ARGV[4 + 3 * n_pol] == 'U' then
  local cost = tonumber(ARGV[5 + 3 * n_pol])
  local a, p1, p2 = pol_a[1], pol_1[1], pol_2[1]
  if not a.single then
    error({ err = 'ERR tower-throttle: no uniform batches for this algorithm' })
  end
  if a.prefetch then
    a.prefetch(KEYS)
  end
  for k = 1, #KEYS do
    run_single(a.single, KEYS[k], p1, p2, cost)
  end
  return finish(now, out)
end

local n_checks = tonumber(ARGV[4 + 3 * n_pol])
local first = 5 + 3 * n_pol

-- Prefetch: each algorithm that can read its keys in one call gets them all.
local wanted = {}
local any = false
for i = 1, n_pol do
  if pol_a[i].prefetch then
    any = true
  end
end
if any then
  local k, b = 1, first
  for _ = 1, n_checks do
    local n = tonumber(ARGV[b])
    b = b + 1
    for _ = 1, n do
      local p = tonumber(ARGV[b])
      local a = pol_a[p]
      if a.prefetch then
        local w = wanted[a]
        if not w then
          w = { seen = {}, keys = {} }
          wanted[a] = w
        end
        local key = KEYS[k]
        if not w.seen[key] then
          w.seen[key] = true
          w.keys[#w.keys + 1] = key
        end
      end
      k = k + 1
      b = b + 2
      if pol_c[p] then
        b = b + 1
      end
    end
  end
  for a, w in pairs(wanted) do
    a.prefetch(w.keys)
  end
end

local k, b = 1, first
for _ = 1, n_checks do
  local n = tonumber(ARGV[b])
  b = b + 1
  for i = 1, n do
    local p = tonumber(ARGV[b])
    rule_key[i], rule_pol[i], rule_cost[i] = KEYS[k], p, tonumber(ARGV[b + 1])
    k = k + 1
    b = b + 2
    if pol_c[p] then
      rule_permit[i] = ARGV[b]
      b = b + 1
    else
      rule_permit[i] = ''
    end
  end
  local p = rule_pol[1]
  local single = n == 1 and pol_a[p].single
  if single then
    run_single(single, rule_key[1], pol_1[p], pol_2[p], rule_cost[1])
  else
    local ok, reply = pcall(one, n)
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
      fail(reply)
    end
  end
end
return finish(now, out)
