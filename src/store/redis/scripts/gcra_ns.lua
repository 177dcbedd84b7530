-- GCRA at nanosecond precision (code 'n'): policies whose emission interval
-- or tolerance is not a whole number of microseconds. p1 = T, p2 = tau, in
-- ns, each read once as an exact pair (µs, ns remainder 0..999).
--
-- A tat is the pair (us, r); both limbs are exact doubles (us < 2^53), and
-- pairs compare lexicographically. Stored, a whole-µs tat is its µs integer
-- (the 'g' encoding) when written whole; any other is NS_OFFSET + tat in
-- ns, a 19-digit integer that Redis's INCRBY handles exactly and that no µs
-- value reaches (µs values stay below 2^52 + 2^50), so every reader tells
-- them apart. An INCRBY of the fast path (below) may leave a whole-µs tat
-- in the ns encoding (remainder 000): every reader takes both. Replies
-- carry the stored encoding; Rust decodes both.

local NS_OFFSET_US = 2400000000000000 -- NS_OFFSET = 2.4·10^18 ns
local NS_MARK = 2.4e18
local fmt = string.format

-- The stored value `v` (nil: absent) as a tat pair; nil for a value that is
-- no tat (see gcra_valid).
local function ns_decode(v)
  if not v then
    return 0, 0, false
  end
  local x = gcra_valid(v)
  if not x then
    return nil
  end
  if x < NS_MARK then
    return x, 0, false
  end
  local us, r = ns_split(v)
  return us - NS_OFFSET_US, r, true
end

local function ns_encode(us, r)
  if r == 0 then
    return int(us)
  end
  return int(us + NS_OFFSET_US) .. fmt('%03d', r)
end

-- Per batch: the pair of each key read or admitted, the value it held in
-- Redis (false: absent), and the keys to write back.
local ns_us, ns_r, ns_stored, ns_dirty = {}, {}, {}, {}
-- The stored pair, and whether it was stored in the ns encoding.
local ns_s_us, ns_s_r, ns_s_enc = {}, {}, {}
-- A batch's T·cost in ns, formatted once: the INCRBY of a busy key.
local ns_inc_us, ns_inc_r, ns_inc_str = nil, nil, nil

-- The tat of stored value `v`, or nil and the error of foreign data.
local function ns_read(key, v)
  local us, r, enc = ns_decode(v)
  if not us then
    return nil, gcra_foreign(key, 'a value that is no tat')
  end
  ns_us[key], ns_r[key], ns_stored[key] = us, r, v or false
  ns_s_us[key], ns_s_r[key], ns_s_enc[key] = us, r, enc
  return us, r
end

-- The tat of `key`, or nil and the error of a key of another type.
local function ns_tat(key)
  local us = ns_us[key]
  if us then
    return us, ns_r[key]
  end
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    return nil, gcra_type_error(key, v.err)
  end
  return ns_read(key, v)
end

-- The tat as the reply carries it: the stored string when unchanged.
local function ns_reply(key, us, r)
  local v = ns_stored[key]
  if v and not ns_dirty[key] then
    return ns_s_enc[key] and v or us
  end
  return r == 0 and us or ns_encode(us, r)
end

-- T·cost as a pair; exact: Rust bounds T·(limit + 2) below 2^50 µs and
-- (limit + 2)·1000 below 2^53.
local function ns_times(t, n)
  local rc = t[2] * n
  local r = rc % 1000
  return t[1] * n + (rc - r) / 1000, r
end

-- Decides cost units (inc = T·cost) against tat at now: allowed, and the
-- new tat when allowed.
local function ns_decide(us, r, inc_us, inc_r, tau, now)
  if us < now then
    us, r = now, 0
  end
  local n_us, n_r = us + inc_us, r + inc_r
  if n_r >= 1000 then
    n_us, n_r = n_us + 1, n_r - 1000
  end
  local h_us = now + tau[1]
  return n_us < h_us or (n_us == h_us and n_r <= tau[2]), n_us, n_r
end

local function ns_write(key, us, r, now)
  local stored = ns_stored[key]
  local expiry = gcra_expiry(r > 0 and us + 1 or us)
  if stored then
    local s_us, s_r = ns_s_us[key], ns_s_r[key]
    local d = us - s_us
    -- INCRBY in place (keeps the TTL) when both use one encoding and the
    -- change in that encoding's unit is exact.
    local by = nil
    if (r > 0) == ns_s_enc[key] and (r > 0 or s_r == 0) then
      if r == 0 then
        by = int(d)
      elseif d == ns_inc_us and r - s_r == ns_inc_r then
        by = ns_inc_str
      elseif d < 8e12 and d > -8e12 then
        by = int(d * 1000 + r - s_r)
      end
    end
    if by and type(pcall_redis('INCRBY', key, by)) ~= 'table' then
      if expiry > gcra_expiry(s_r > 0 and s_us + 1 or s_us) then
        call_redis('PEXPIRE', key, ttl_ms(expiry - now))
      end
      return
    end
  end
  call_redis('SET', key, ns_encode(us, r), 'PX', ttl_ms(expiry - now))
end

flush[#flush + 1] = function(now)
  for key in pairs(ns_dirty) do
    ns_write(key, ns_us[key], ns_r[key], now)
  end
end

local function ns_commit(key, us, r)
  ns_us[key], ns_r[key], ns_dirty[key] = us, r, true
end

-- The fast path of gcra_ns_batch.lua: most checks of a busy key decide
-- without the remainder. ONE tonumber of a stored ns encoding (19 digits,
-- below 2^63) is the value correctly rounded to a multiple of at most 1024,
-- so within 512 ns; subtracting NS_MARK (a multiple of 2^20) is exact, and
-- dividing by 1000 rounds by at most 0.5 µs (the quotient is below 2^53).
-- So (x − NS_MARK) / 1000 is within 1.02 µs of the exact tat. Where every
-- fact the script needs (the tat is ahead of now; admitted, or denied; the
-- second the key expires in, before and after) holds for every value
-- within 3 µs of it, the exact decision is known; the write is an INCRBY
-- of T·cost in ns, exact in Redis, and the reply the stored string.
-- Anywhere else the exact pair is read. This halves the script's work per
-- busy key (two string.sub and three tonumber fewer, one table write
-- instead of nine).

-- Keys admitted on the fast path: key → the stored string, to move by
-- exactly T·cost (ns_inc_*); and key → its new expiry (µs) when it moves.
local ns_fast, ns_fast_exp = {}, {}

-- A key admitted on the fast path and checked again in the batch: its
-- exact pair, plus T·cost, as if the exact path had admitted it.
local function ns_unfast(key)
  local us, r = ns_read(key, ns_fast[key])
  r = r + ns_inc_r
  if r >= 1000 then
    us, r = us + 1, r - 1000
  end
  ns_commit(key, us + ns_inc_us, r)
  ns_fast[key], ns_fast_exp[key] = nil, nil
end

flush[#flush + 1] = function(now)
  for key, v in pairs(ns_fast) do
    if type(pcall_redis('INCRBY', key, ns_inc_str)) == 'table' then
      -- A value Redis reads as no integer (never written by this crate):
      -- written whole, exactly, as the exact path would; deleted when even
      -- its digits are no pair.
      local us, r = ns_split(v)
      if us and r then
        ns_unfast(key)
        ns_stored[key] = false
        ns_write(key, ns_us[key], ns_r[key], now)
      else
        call_redis('DEL', key)
      end
    else
      local e = ns_fast_exp[key]
      if e then
        call_redis('PEXPIRE', key, ttl_ms(e - now))
      end
    end
  end
end

local function ns_param(v)
  return { ns_split(v) }
end

algo.n = {
  param = ns_param,

  prefetch = function(keys)
    local vals = redis.call('MGET', unpack(keys))
    for i = 1, #keys do
      local v = vals[i]
      if v and gcra_valid(v) then
        ns_read(keys[i], v)
      end
    end
  end,

  check = function(key, t, tau, cost, _, now)
    local us, r = ns_tat(key)
    if not us then
      error({ err = r })
    end
    local inc_us, inc_r = ns_times(t, cost)
    local allowed, n_us, n_r = ns_decide(us, r, inc_us, inc_r, tau, now)
    local reply = { allowed and 1 or 0, ns_reply(key, us, r) }
    local commit = nil
    if allowed and cost > 0 then
      commit = function()
        ns_commit(key, n_us, n_r)
      end
    end
    return allowed, reply, commit
  end,

  -- As gcra.lua's: back by T·amount less the time held, in (µs, ns) pairs
  -- (the time held is whole µs).
  refund = function(key, t, _, amount, now, receipt)
    local us, r = ns_tat(key)
    if not us then
      error({ err = r })
    end
    local b_us, b_r = ns_times(t, amount)
    b_us = b_us - math.max(now - receipt.at, 0)
    if b_us < 0 then
      b_us, b_r = 0, 0
    end
    us, r = us - b_us, r - b_r
    if r < 0 then
      us, r = us - 1, r + 1000
    end
    if us < now or (us == now and r == 0) then
      redis.call('DEL', key)
    else
      ns_stored[key] = false
      ns_write(key, us, r, now)
    end
  end,
}

-- A single-rule check straight into the batch reply `out` after index `n`
-- (see check.lua's uniform batches); returns the new length, or nil and an
-- error.
algo.n.single = function(key, t, tau, cost, now, out, n)
  local us, r = ns_tat(key)
  if not us then
    return nil, r
  end
  local inc_us, inc_r = ns_times(t, cost)
  local allowed, n_us, n_r = ns_decide(us, r, inc_us, inc_r, tau, now)
  out[n + 1] = 1
  out[n + 2] = allowed and 1 or 0
  out[n + 3] = ns_reply(key, us, r)
  if allowed and cost > 0 then
    ns_commit(key, n_us, n_r)
  end
  return n + 3
end
