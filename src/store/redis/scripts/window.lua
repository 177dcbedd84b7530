-- tower-throttle: window indices and exact products shared by the fixed-
-- and sliding-window scripts (appended after common.lua, before them).

-- WINDOW INDICES (fixed and sliding windows). The window of w ns holding
-- `now` µs is floor(1000·now / w): below 2^52 for w >= 1000 ns, up to
-- 1000·2^52 for shorter windows. An index is a number below 2^53 and the
-- pair { hi, lo } = 1000·hi + lo (0 <= lo < 1000) from 2^53 on: one form per
-- value, so equal indices have equal forms. States hold it in decimal;
-- `dur_split` (common.lua) reads either form as (hi, lo).
local WIN_BIG = 9007199254740992 -- 2^53

local function win_idx(hi, lo)
  if hi < 9007199254740 or (hi == 9007199254740 and lo < 992) then
    return 1000 * hi + lo
  end
  return { hi, lo }
end

local function win_lt(x, y)
  local tx, ty = type(x) == 'table', type(y) == 'table'
  if not (tx or ty) then
    return x < y
  elseif not (tx and ty) then
    return ty -- every number is below every pair
  end
  return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2])
end

local function win_eq(x, y)
  if type(x) == 'table' and type(y) == 'table' then
    return x[1] == y[1] and x[2] == y[2]
  end
  return x == y
end

-- x + d for a small d >= 0.
local function win_add(x, d)
  if type(x) ~= 'table' and x + d < WIN_BIG then
    return x + d
  end
  local hi, lo = dur_split(x)
  local c = fdiv(lo + d, 1000)
  return win_idx(hi + c, lo + d - 1000 * c)
end

-- k − q, exact while it is below 2^53 / 1000 (a TTL beyond rounds harmlessly).
local function win_diff(k, q)
  if type(k) ~= 'table' and type(q) ~= 'table' then
    return k - q
  end
  local kh, kl = dur_split(k)
  local qh, ql = dur_split(q)
  return 1000 * (kh - qh) + (kl - ql)
end

-- The decimal digits of an index, and the index as a reply field (Rust
-- reads a string as the number it spells).
local function win_str(x)
  if type(x) == 'table' then
    return int(x[1]) .. string.format('%03d', x[2])
  end
  return int(x)
end

local function win_reply(x)
  if type(x) == 'table' then
    return win_str(x)
  end
  return x
end

-- A stored index from its digits (the caller's pattern): nil from
-- 1000·2^52 on, which no window of 1 ns or more reaches before 2^52 µs.
local function win_parse(d)
  if #d <= 15 then
    return tonumber(d)
  end
  local hi = tonumber(string.sub(d, 1, -4))
  if hi and hi < LIMIT then
    return win_idx(hi, tonumber(string.sub(d, -3)))
  end
  return nil
end

-- For windows in NANOSECONDS (the ns forms of 'f' and 's'): the index q = floor(1000·now
-- / w) and the ns r = 1000·now − q·w elapsed in it, exactly, although 1000·now
-- (about 1.8·10^18) is no exact double. r is a number, or a { µs, ns } pair
-- when w is one. `now` is one value per script run: results are kept.
-- * w < 1000: now = a·w + m (m < w); 1000·m = c·w + r with c < 1000 as
--   m < w; so q = 1000·a + c (an index pair from 2^53 on), every term exact.
-- * 1000 <= w <= 2^49: long division one decimal digit at a time from
--   now = q·w + r: 10·(q·w + r) = (10·q + d)·w + (10·r − d·w) with
--   d = floor(10·r / w) in 0..9; 10·r < 10·w < 2^53 is exact, and every q on
--   the way is at most 1000·now / w < 2^52. Three steps give (q, r).
-- * w > 2^49 (as w = 1000·wu + wn): q < 1000·2^52 / 2^49 = 8000, estimated
--   in doubles (off by at most one) and corrected until
--   r = 1000·(now − q·wu) − q·wn, kept as a (µs, ns) pair, is in [0, w);
--   q·wn < 8·10^6 and q·wu <= now + 2·wu < 2^53 are exact.
local function win_divmod_at(now, w)
  local q, r
  if type(w) ~= 'table' and w < 1000 then
    local a = fdiv(now, w)
    local m = 1000 * (now - a * w)
    local c = fdiv(m, w)
    q, r = win_idx(a, c), m - c * w
  elseif type(w) ~= 'table' and w <= 562949953421312 then -- 2^49
    q = fdiv(now, w)
    r = now - q * w
    for _ = 1, 3 do
      local d = fdiv(10 * r, w)
      q, r = 10 * q + d, 10 * r - d * w
    end
  else
    local wu, wn = dur_split(w)
    local ru, rn
    q = math.floor(now / (wu + wn / 1000))
    while true do
      local b = q * wn
      local bu = fdiv(b, 1000)
      ru, rn = now - q * wu - bu, 1000 * bu - b
      if rn < 0 then
        ru, rn = ru - 1, rn + 1000
      end
      if ru < 0 then
        q = q - 1
      elseif ru > wu or (ru == wu and rn >= wn) then
        q = q + 1
      else
        break
      end
    end
    r = 1000 * ru + rn
    if type(w) == 'table' then
      r = { ru, rn }
    end
  end
  return q, r
end

-- win_divmod_at at the script's `now`, once per window length: a batch
-- divides by the same few windows many times.
local divmod_q, divmod_r = {}, {}
local function win_divmod(now, w)
  local q = divmod_q[w]
  if q then
    return q, divmod_r[w]
  end
  local r
  q, r = win_divmod_at(now, w)
  divmod_q[w], divmod_r[w] = q, r
  return q, r
end

-- The index of the window holding `now` and the time elapsed in it, for a
-- window w in µs (ns = false, both in µs) or in ns (ns = true, both in ns).
local function win_pos(now, w, ns)
  if ns then
    return win_divmod(now, w)
  end
  local q = fdiv(now, w)
  return q, now - q * w
end

-- The index of the window holding instant `t` µs (a receipt's, not the
-- script's `now`, so never from the cache).
local function win_index_at(t, w, ns)
  if ns then
    return (win_divmod_at(t, w))
  end
  return fdiv(t, w)
end

-- µs (rounded up) from `now` until window k (at or after now's) starts:
-- (k − q)·w − r, as ((k − q)·wu − ru) µs + ((k − q)·wn − rn) ns in ns.
-- Exact for the few windows a state spans.
local function win_until(now, w, ns, k)
  if not ns then
    return k * w - now
  end
  local q, r = win_divmod(now, w)
  local d = win_diff(k, q)
  local wu, wn = dur_split(w)
  local ru, rn = dur_split(r)
  return d * wu - ru + fdiv(d * wn - rn + 999, 1000)
end

-- EXACT PRODUCTS for the sliding window's admission. Integers as limbs
-- base 2^24, least significant first: products of two limbs are below 2^48
-- and a sum of a few of them stays exact.
local WIN_LIMB = 16777216 -- 2^24

-- Carries limbs (each an exact non-negative integer) so each is < 2^24.
local function win_carry(l)
  local c = 0
  for i = 1, #l do
    local v = l[i] + c
    local lo = v % WIN_LIMB
    l[i], c = lo, (v - lo) / WIN_LIMB
  end
  while c > 0 do
    local lo = c % WIN_LIMB
    l[#l + 1], c = lo, (c - lo) / WIN_LIMB
  end
  return l
end

-- The limbs of a number below 2^53 or of a { µs, ns } pair.
local function win_limbs(x)
  if type(x) ~= 'table' then
    return win_carry({ x })
  end
  local l = win_limbs(x[1])
  for i = 1, #l do
    l[i] = 1000 * l[i]
  end
  l[1] = l[1] + x[2]
  return win_carry(l)
end

local function win_mul(a, b)
  local p = {}
  for k = 1, #a + #b do
    p[k] = 0
  end
  for i = 1, #a do
    for j = 1, #b do
      p[i + j - 1] = p[i + j - 1] + a[i] * b[j]
    end
  end
  return win_carry(p)
end

local function win_le(a, b)
  for i = math.max(#a, #b), 1, -1 do
    local x, y = a[i] or 0, b[i] or 0
    if x ~= y then
      return x < y
    end
  end
  return true
end

-- Whether a sliding window of w with `prev` and `cur` units, e into it,
-- admits `cost` more: prev·(w − e) + (cur + cost)·w <= max·w, that is
-- cur + cost <= max and prev·(w − e) <= (max − cur − cost)·w. Compared in
-- doubles while both products are below 2^53 (a product that rounds to
-- less than 2^53 is exact), else in limbs.
local function win_fits(prev, cur, cost, max, w, e)
  local room = max - cur - cost
  if room < 0 then
    return false
  elseif prev == 0 then
    return true
  end
  local left
  if type(w) ~= 'table' then
    left = w - e
    local a, b = prev * left, room * w
    if a < WIN_BIG and b < WIN_BIG then
      return a <= b
    end
  elseif e == 0 then
    left = w
  else
    local u, n = w[1] - e[1], w[2] - e[2]
    if n < 0 then
      u, n = u - 1, n + 1000
    end
    left = { u, n }
  end
  return win_le(win_mul(win_limbs(prev), win_limbs(left)), win_mul(win_limbs(room), win_limbs(w)))
end
