-- The `decide` entry point: one plan of limits, decided all or nothing in
-- one call, as crates/core/src/plan.rs decides it.
--
-- KEYS: the state key of every plan item, in plan order.
-- ARGV: 1 seconds and 2 nanoseconds of now ('' and '': Redis's TIME),
--       3 mode (0 try, 1 acquire), 4 hits, 5 min_hits, 6 item count, then
--       per item: algorithm code, shadow (0/1), parameter count, parameters.
-- Reply: granted, allowed, wait, limited_by (-1: none), shadow_limited,
--        then per item: granted, allowed, limit, remaining, reset_after,
--        retry_after (-1: never), wait, tier index (-1: no tier), tier
--        limit, tier hits, tier burst, room.
-- Errors (nothing changed): 'TOLLGATE cannot_schedule I',
-- 'TOLLGATE never_admits I' and 'TOLLGATE too_long I' (a wait of 2^52 ns
-- or more) for item I (0-based) in acquire mode.

if ARGV[1] == '' then
  local t = redis.call('TIME')
  T.init(tonumber(t[1]), tonumber(t[2]) * 1000)
else
  T.init(tonumber(ARGV[1]), tonumber(ARGV[2]))
end

local mode = tonumber(ARGV[3])
local req = { hits = tonumber(ARGV[4]), min_hits = tonumber(ARGV[5]) }
local n = tonumber(ARGV[6])
local now = 0

local items = {}
local at = 7
for i = 1, n do
  local code = tonumber(ARGV[at])
  local m = algorithm(code)
  local shadow = ARGV[at + 1] == '1'
  local count = tonumber(ARGV[at + 2])
  local p = {}
  for j = 1, count do p[j] = tonumber(ARGV[at + 2 + j]) end
  at = at + 3 + count
  local raw = redis.call('GET', KEYS[i])
  local st
  if raw then
    local v = cmsgpack.unpack(raw)
    if type(v) == 'table' and v[1] == code then
      st = m.decode(p, v, v[2])
    end
  end
  if not st then st = m.fresh(p, now) end
  items[i] = { m = m, p = p, st = st, shadow = shadow, code = code }
end

local decisions = {}
local rooms = {}
local out_granted, out_allowed, out_wait, limited_by, shadow_limited

if mode == 1 then
  -- Acquire: every limit must be able to schedule; the wait is the longest
  -- of the non-shadow limits' own waits.
  local wait = 0
  for i, it in ipairs(items) do
    if not it.m.acquire_wait then
      return redis.error_reply('TOLLGATE cannot_schedule ' .. (i - 1))
    end
    local w = it.m.acquire_wait(it.p, it.st, now, req.hits)
    if not w then
      return redis.error_reply('TOLLGATE never_admits ' .. (i - 1))
    end
    -- A debt of 2^52 ns (52 days) or more could not be counted exactly;
    -- refused before anything changes.
    if w >= TWO52 then
      return redis.error_reply('TOLLGATE too_long ' .. (i - 1))
    end
    if not it.shadow then wait = max(wait, w) end
  end
  for i, it in ipairs(items) do
    rooms[i] = req.hits
    decisions[i] = it.m.acquire_at(it.p, it.st, now, req.hits, wait)
  end
  out_granted, out_allowed, out_wait = req.hits, true, wait
  limited_by, shadow_limited = -1, false
else
  local room = 0
  if req.min_hits <= req.hits then room = req.hits end
  limited_by = -1
  for i, it in ipairs(items) do
    local r = it.m.room(it.p, it.st, now, req.hits)
    rooms[i] = r
    if not it.shadow and r < room then
      room = r
      limited_by = i - 1
    end
  end
  local grant = grant_from_room(req, room)
  shadow_limited = false
  local wait = 0
  for i, it in ipairs(items) do
    local own = grant
    if it.shadow then
      own = grant_from_room(req, min(rooms[i], room))
      if own.granted < grant.granted then shadow_limited = true end
    end
    local d = it.m.commit(it.p, it.st, now, req, own)
    if not it.shadow then wait = max(wait, d.wait) end
    decisions[i] = d
  end
  out_granted, out_allowed, out_wait = grant.granted, grant.allowed, wait
  if grant.granted >= req.hits then limited_by = -1 end
end

-- Write back: an idle state is deleted (a missing key is a fresh state);
-- any other expires once it must have become idle, plus a margin. Redis
-- expires keys by its own wall clock; with the caller's clock (tests,
-- replays) the caller's time may run far slower than the wall clock, so
-- the margin is an hour there rather than a second.
local margin_ms = 1000
if ARGV[1] ~= '' then margin_ms = 3600000 end
for i, it in ipairs(items) do
  if it.m.is_idle(it.p, it.st, now) then
    redis.call('DEL', KEYS[i])
  else
    local v = it.m.encode(it.p, it.st)
    table.insert(v, 1, T.S)
    table.insert(v, 1, it.code)
    local ttl_ms = floor(it.m.ttl(it.p, it.st, now) / 1000000) + margin_ms
    redis.call('SET', KEYS[i], cmsgpack.pack(v), 'PX', ttl_ms)
  end
end

local function flag(b)
  if b then return 1 end
  return 0
end

local reply = { out_granted, flag(out_allowed), out_wait, limited_by, flag(shadow_limited) }
for i, d in ipairs(decisions) do
  reply[#reply + 1] = d.granted
  reply[#reply + 1] = flag(d.allowed)
  reply[#reply + 1] = d.limit
  reply[#reply + 1] = d.remaining
  reply[#reply + 1] = d.reset_after
  reply[#reply + 1] = d.retry_after or -1
  reply[#reply + 1] = d.wait
  if d.tier then
    reply[#reply + 1] = d.tier.index
    reply[#reply + 1] = d.tier.limit
    reply[#reply + 1] = d.tier.hits
    reply[#reply + 1] = flag(d.tier.burst)
  else
    reply[#reply + 1] = -1
    reply[#reply + 1] = 0
    reply[#reply + 1] = 0
    reply[#reply + 1] = 0
  end
  reply[#reply + 1] = rooms[i]
end
return reply
