-- tollgate's Lua prelude: time, exact integer arithmetic on doubles, and
-- the table of algorithms. Every script tollgate sends to Redis starts with
-- this file; the algorithm files and one entry file follow it, all in one
-- chunk, so everything here is a local the later files can see.
--
-- Numbers. Redis runs Lua 5.1, whose only number is a double: integers are
-- exact up to 2^53. tollgate's core works in u64 nanoseconds since the Unix
-- epoch (about 1.8e18, past 2^53), so scripts never hold an absolute time.
-- Every time inside a script is RELATIVE to the script's `now`, in
-- nanoseconds: `now` itself is 0, a time one second ago is -1e9. Stored
-- times are written relative to a base second saved beside them (T.put,
-- T.get), so what is stored and what is computed stay small. The Redis
-- store refuses limits whose spans or counts reach 2^52 (see params.rs),
-- which keeps every sum and difference a script forms exact.
--
-- Integer division: math.floor(a / b) is exact for integers 0 <= a < 2^53,
-- b >= 1 (a correctly rounded quotient never reaches the next integer), so
-- `idiv` is that. Products that may pass 2^53 go through `muldiv` or
-- `mulmod`, which never form them.
--
-- Algorithm modules register themselves in ALG[code] (codes in params.rs)
-- as a table with these fields; `p` is the array of parameters the Rust side
-- sent, `st` the module's own state table, `now` a relative time, `req`
-- {hits=, min_hits=} and `grant` {granted=, allowed=}:
--   name                        the algorithm's config name
--   fresh(p, now) -> st         the state of a key never seen
--   decode(p, v, base) -> st    from the stored array v (v[1] is the code,
--                               v[2] the base second, fields from v[3])
--   encode(p, st) -> array      the fields to store after code and base
--   room(p, st, now, hits) -> n
--   commit(p, st, now, req, grant) -> decision (changes st)
--   is_idle(p, st, now) -> bool
--   ttl(p, st, now) -> ns       an upper bound on the time until is_idle
--   acquire_wait(p, st, now, hits) -> ns or nil     (only if it schedules)
--   acquire_at(p, st, now, hits, wait) -> decision  (only if it schedules)
-- A decision is a table {granted=, allowed=, limit=, remaining=,
-- reset_after=, retry_after= (false: never), wait=, tier= (nil or {index=,
-- limit=, hits=, burst=})}, the fields of tollgate_core::Decision.

local TWO52 = 4503599627370496
local TWO53 = 9007199254740992

-- A time before anything a script will see: stands for the core's
-- `Nanos::ZERO` used as "long ago" (a fresh GCRA state, say). Sums with it
-- are inexact, but they stay hugely negative, which is all that matters.
local PAST = -4611686018427387904

local floor = math.floor
local ceil = math.ceil
local min = math.min
local max = math.max

-- floor(a / b) for integers a >= 0 (< 2^53) and b >= 1.
local function idiv(a, b)
  return floor(a / b)
end

-- a mod b for integers a >= 0 (< 2^53) and b >= 1.
local function imod(a, b)
  return a - floor(a / b) * b
end

-- Rust's `f as i64` for a finite f: truncation toward zero.
local function trunc(x)
  if x >= 0 then return floor(x) end
  return ceil(x)
end

-- Rust's `Nanos::saturating_sub`: a - b, or 0 if that is negative.
local function sat_sub(a, b)
  local d = a - b
  if d < 0 then return 0 end
  return d
end

-- The bits of b (an integer >= 0), least significant first.
local function bits_of(b)
  local bits = {}
  while b > 0 do
    local h = floor(b / 2)
    bits[#bits + 1] = b - 2 * h
    b = h
  end
  return bits
end

-- (a * b) mod m for integers 0 <= a, b < 2^53 and 1 <= m <= 2^52, without
-- forming a * b: doubling and adding, reduced at every step, so nothing
-- passes 2^53.
local function mulmod(a, b, m)
  a = imod(a, m)
  local bits = bits_of(b)
  local r = 0
  for i = #bits, 1, -1 do
    r = r * 2
    if r >= m then r = r - m end
    if bits[i] == 1 then
      r = r + a
      if r >= m then r = r - m end
    end
  end
  return r
end

-- floor(a * b / c) and (a * b) mod c for integers 0 <= a, b < 2^53 and
-- 1 <= c <= 2^52. Exact whenever the quotient is below 2^53.
local function muldivmod(a, b, c)
  local p = a * b
  if p < TWO53 then
    local q = floor(p / c)
    return q, p - q * c
  end
  local qa = floor(a / c)
  local ra = a - qa * c
  local bits = bits_of(b)
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = q * 2
    r = r * 2
    if r >= c then r = r - c; q = q + 1 end
    if bits[i] == 1 then
      r = r + ra
      if r >= c then r = r - c; q = q + 1 end
    end
  end
  return qa * b + q, r
end

-- floor(a * b / c), see muldivmod.
local function muldiv(a, b, c)
  local q = muldivmod(a, b, c)
  return q
end

-- ceil(a * b / c), see muldivmod.
local function muldiv_ceil(a, b, c)
  local q, r = muldivmod(a, b, c)
  if r > 0 then return q + 1 end
  return q
end

-- The clock. The script's now is T.S seconds and T.NS nanoseconds since
-- the Unix epoch; scripts see it as relative time 0.
local T = { S = 0, NS = 0 }

function T.init(s, ns)
  T.S = s
  T.NS = ns
  -- now in microseconds since the epoch (exact: about 1.8e15 < 2^53), and
  -- what lies below the microsecond, for algorithms that count in
  -- microseconds as Guava does.
  T.US = s * 1000000 + floor(ns / 1000)
  T.SUBUS = ns - floor(ns / 1000) * 1000
end

-- A stored time (nanoseconds after base second `base`) as a relative time.
function T.get(stored, base)
  return stored + (base - T.S) * 1000000000 - T.NS
end

-- A relative time as a stored one, relative to base second T.S (the base
-- the entry script saves).
function T.put(rel)
  return rel + T.NS
end

-- (absolute time of `rel`) mod m, exact for 1 <= m <= 2^52: what
-- `now.as_u64() % m` is in the core.
function T.mod(rel, m)
  local secs = mulmod(T.S, 1000000000, m)
  local rest = T.NS + rel
  local r = imod(secs + imod(rest - floor(rest / m) * m, m), m)
  return r
end

-- The algorithms, by code (see params.rs), built on first use in a call:
-- LOADERS[code] defines the module and registers it in ALG. Defining
-- every algorithm's functions on every call cost more than the decision
-- itself (about 20 of 55 µs per call).
local ALG = {}
local LOADERS = {}

-- The module of algorithm `code`, or nil for a code no file defines.
local function algorithm(code)
  local m = ALG[code]
  if m == nil then
    local load = LOADERS[code]
    if load == nil then return nil end
    load()
    m = ALG[code]
  end
  return m
end

-- Rust's `Grant::from_room`.
local function grant_from_room(req, room)
  if req.min_hits > req.hits then
    return { granted = 0, allowed = false }
  end
  local n = min(room, req.hits)
  if n >= req.min_hits then
    return { granted = n, allowed = true }
  end
  return { granted = 0, allowed = false }
end
