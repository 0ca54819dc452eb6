-- The `decide` entry point: a batch of plans, each decided all or nothing
-- as crates/core/src/plan.rs decides it, one after the other in one call
-- (concurrent decisions share a round trip and the script's fixed cost).
--
-- KEYS: the state key of every item of every plan, plan after plan.
-- ARGV: 1 plan count, 2 limit count, then per limit: algorithm code,
--       parameter count, parameters (each limit once per call, however
--       many plans of the call use it: a batch usually holds many plans of
--       few limits, and reading a limit's parameters cost more than
--       anything else per plan); then per plan: seconds and nanoseconds of
--       now ('' and '': Redis's TIME, read once per call), mode (0 try, 1
--       acquire, 2 report, 3 refund, -1 inspect: a try of zero hits that writes nothing back,
--       so a missing key stays missing), hits, min_hits, item count, then per item: the limit's
--       number in the list above (from 1), shadow (0/1). A negative item
--       count -n: n items, each with a third number, hits of its own that
--       it is asked exactly in place of the request's (-1: the request's;
--       Envoy descriptors with their own hits_addend), as PlanEntry::hits
--       in crates/core/src/plan.rs.
-- Reply: one MessagePack array of integers (cmsgpack.pack: one bulk
--        string, which the server reads far faster than hundreds of RESP
--        integers), holding per plan a status, then
--        - 0 (decided): granted, allowed, wait, limited_by (-1: none),
--          shadow_limited, then per item: granted, allowed, limit,
--          remaining, reset_after, retry_after (-1: never), wait, tier
--          index (-1: no tier), tier limit, tier hits, tier burst, room
--          (a calendar window's reset_after or retry_after of 2^53 ns or
--          more is the array {seconds, nanoseconds}: fixed_window.lua);
--        - 1 cannot_schedule, 2 never_admits or 3 too_long (a wait of
--          2^52 ns or more), in acquire mode, or 4 no_usage (an algorithm
--          without a sound debt) in report or refund mode, then the item's
--          index (0-based): the plan changed nothing.

local ERR_CANNOT_SCHEDULE, ERR_NEVER_ADMITS, ERR_TOO_LONG, ERR_NO_USAGE = 1, 2, 3, 4

local function flag(b)
  if b then return 1 end
  return 0
end

-- Redis's TIME, read and set once per call (T.init), and whether T holds
-- it now.
local redis_time
local redis_now = false

-- The reply, and its length so far (appends by index: `#` costs a search
-- on every append).
local reply = {}
local nr = 0

-- The call's limits, by number: code, module and parameters (read once).
local LIMITS = {}

-- Decides the plan whose arguments start at ARGV[a] and whose keys start
-- at KEYS[k + 1]; appends its answer to the reply. Returns the index of the
-- next plan's arguments and the number of keys it used.
local function decide_plan(a, k)
  if ARGV[a] == '' then
    if not redis_time then redis_time = redis.call('TIME') end
    if not redis_now then
      T.init(tonumber(redis_time[1]), tonumber(redis_time[2]) * 1000)
      redis_now = true
    end
  else
    T.init(tonumber(ARGV[a]), tonumber(ARGV[a + 1]))
    redis_now = false
  end
  local caller_clock = ARGV[a] ~= ''
  local mode = tonumber(ARGV[a + 2])
  local inspect = mode == -1
  local req = { hits = tonumber(ARGV[a + 3]), min_hits = tonumber(ARGV[a + 4]) }
  local n = tonumber(ARGV[a + 5])
  local own_hits = n < 0
  if own_hits then n = -n end
  local now = 0

  local items = {}
  local at = a + 6
  for i = 1, n do
    local lim = LIMITS[tonumber(ARGV[at])]
    local code, m, p = lim.code, lim.m, lim.p
    local shadow = ARGV[at + 1] == '1'
    -- Hits of its own, and the request it is asked.
    local hits, asked = nil, req
    if own_hits then
      local h = tonumber(ARGV[at + 2])
      if h >= 0 then hits, asked = h, { hits = h, min_hits = h } end
      at = at + 3
    else
      at = at + 2
    end
    local raw = redis.call('GET', KEYS[k + i])
    local st
    if raw then
      local v = cmsgpack.unpack(raw)
      if type(v) == 'table' and v[1] == code then
        st = m.decode(p, v, v[2])
      end
    end
    if not st then st = m.fresh(p, now) end
    items[i] = { m = m, p = p, st = st, shadow = shadow, code = code, hits = hits, req = asked }
  end

  local decisions = {}
  local rooms = {}
  local out_granted, out_allowed, out_wait, limited_by, shadow_limited

  if mode == 2 or mode == 3 then
    -- Report or refund (crates/core/src/plan.rs `usage`): every item on
    -- its own, as far as its bound allows; the plan's grant is the least
    -- a live item took.
    for i, it in ipairs(items) do
      if not it.m.usage then
        nr = nr + 1; reply[nr] = ERR_NO_USAGE
        nr = nr + 1; reply[nr] = i - 1
        return at, n
      end
    end
    local refund = mode == 3
    -- The largest part of its hits a live item could not take.
    local shortfall = 0
    limited_by = -1
    for i, it in ipairs(items) do
      local asked = it.req.hits
      rooms[i] = it.m.room(it.p, it.st, now, asked)
      local d = it.m.usage(it.p, it.st, now, asked, refund)
      local short = sat_sub(asked, d.granted)
      if not it.shadow and short > shortfall then
        shortfall = short
        limited_by = i - 1
      end
      decisions[i] = d
    end
    out_granted, out_allowed, out_wait = sat_sub(req.hits, shortfall), true, 0
    shadow_limited = false
  elseif mode == 1 then
    -- Acquire: every limit must be able to schedule; the wait is the
    -- longest of the non-shadow limits' own waits.
    local wait = 0
    for i, it in ipairs(items) do
      if not it.m.acquire_wait then
        nr = nr + 1; reply[nr] = ERR_CANNOT_SCHEDULE
        nr = nr + 1; reply[nr] = i - 1
        return at, n
      end
      local w = it.m.acquire_wait(it.p, it.st, now, it.req.hits)
      if not w then
        nr = nr + 1; reply[nr] = ERR_NEVER_ADMITS
        nr = nr + 1; reply[nr] = i - 1
        return at, n
      end
      -- A debt of 2^52 ns (52 days) or more could not be counted exactly;
      -- refused before anything changes.
      if w >= TWO52 then
        nr = nr + 1; reply[nr] = ERR_TOO_LONG
        nr = nr + 1; reply[nr] = i - 1
        return at, n
      end
      if not it.shadow then wait = max(wait, w) end
    end
    for i, it in ipairs(items) do
      rooms[i] = it.req.hits
      decisions[i] = it.m.acquire_at(it.p, it.st, now, it.req.hits, wait)
    end
    out_granted, out_allowed, out_wait = req.hits, true, wait
    limited_by, shadow_limited = -1, false
  else
    local room = 0
    if req.min_hits <= req.hits then room = req.hits end
    limited_by = -1
    -- The first live item asked hits of its own without room for them
    -- all (0-based; -1: none): it alone refuses the plan.
    local own_short = -1
    for i, it in ipairs(items) do
      local r = it.m.room(it.p, it.st, now, it.req.hits)
      rooms[i] = r
      if not it.shadow then
        if not it.hits then
          if r < room then
            room = r
            limited_by = i - 1
          end
        elseif r < it.hits and own_short < 0 then
          own_short = i - 1
        end
      end
    end
    local grant = grant_from_room(req, room)
    if own_short >= 0 then
      if grant.allowed then limited_by = own_short end
      grant = { granted = 0, allowed = false }
    end
    shadow_limited = false
    local wait = 0
    local all_own = true
    for i, it in ipairs(items) do
      local own
      if it.hits then
        -- Its own hits, all or none: the plan's verdict, and for a shadow
        -- item its own room too.
        local fits = grant.allowed and ((not it.shadow) or rooms[i] >= it.hits)
        if it.shadow and grant.allowed and not fits then shadow_limited = true end
        if fits then
          own = { granted = it.hits, allowed = true }
        else
          own = { granted = 0, allowed = false }
        end
      else
        all_own = false
        own = grant
        if it.shadow then
          if own_short < 0 then own = grant_from_room(req, min(rooms[i], room)) end
          if own.granted < grant.granted then shadow_limited = true end
        end
      end
      local d = it.m.commit(it.p, it.st, now, it.req, own)
      if not it.shadow then wait = max(wait, d.wait) end
      decisions[i] = d
    end
    local granted = grant.granted
    if all_own and grant.allowed then granted = req.hits end
    out_granted, out_allowed, out_wait = granted, grant.allowed, wait
    if granted >= req.hits and own_short < 0 then limited_by = -1 end
  end

  -- Write back: an idle state is deleted (a missing key is a fresh
  -- state); any other expires once it must have become idle, plus a
  -- margin. Redis expires keys by its own wall clock; with the caller's
  -- clock (tests, replays) the caller's time may run far slower than the
  -- wall clock, so the margin is an hour there rather than a second.
  local margin_ms = 1000
  if caller_clock then margin_ms = 3600000 end
  -- An inspection reads only: no key is created, changed or expired.
  local n_write = n
  if inspect then n_write = 0 end
  for i = 1, n_write do
    local it = items[i]
    if it.m.is_idle(it.p, it.st, now) then
      redis.call('DEL', KEYS[k + i])
    else
      local v = it.m.encode(it.p, it.st)
      table.insert(v, 1, T.S)
      table.insert(v, 1, it.code)
      local ttl_ms = floor(it.m.ttl(it.p, it.st, now) / 1000000) + margin_ms
      redis.call('SET', KEYS[k + i], cmsgpack.pack(v), 'PX', ttl_ms)
    end
  end

  nr = nr + 1; reply[nr] = 0
  nr = nr + 1; reply[nr] = out_granted
  nr = nr + 1; reply[nr] = flag(out_allowed)
  nr = nr + 1; reply[nr] = out_wait
  nr = nr + 1; reply[nr] = limited_by
  nr = nr + 1; reply[nr] = flag(shadow_limited)
  for i, d in ipairs(decisions) do
    nr = nr + 1; reply[nr] = d.granted
    nr = nr + 1; reply[nr] = flag(d.allowed)
    nr = nr + 1; reply[nr] = d.limit
    nr = nr + 1; reply[nr] = d.remaining
    nr = nr + 1; reply[nr] = d.reset_after
    nr = nr + 1; reply[nr] = d.retry_after or -1
    nr = nr + 1; reply[nr] = d.wait
    if d.tier then
      nr = nr + 1; reply[nr] = d.tier.index
      nr = nr + 1; reply[nr] = d.tier.limit
      nr = nr + 1; reply[nr] = d.tier.hits
      nr = nr + 1; reply[nr] = flag(d.tier.burst)
    else
      nr = nr + 1; reply[nr] = -1
      nr = nr + 1; reply[nr] = 0
      nr = nr + 1; reply[nr] = 0
      nr = nr + 1; reply[nr] = 0
    end
    nr = nr + 1; reply[nr] = rooms[i]
  end
  return at, n
end

local a = 3
for i = 1, tonumber(ARGV[2]) do
  local code = tonumber(ARGV[a])
  local count = tonumber(ARGV[a + 1])
  local p = {}
  for j = 1, count do p[j] = tonumber(ARGV[a + 1 + j]) end
  LIMITS[i] = { code = code, m = algorithm(code), p = p }
  a = a + 2 + count
end

local k = 0
for _ = 1, tonumber(ARGV[1]) do
  local next_a, used = decide_plan(a, k)
  a, k = next_a, k + used
end
return cmsgpack.pack(reply)
