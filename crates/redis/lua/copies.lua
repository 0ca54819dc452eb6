-- The copy log (Charon §4.2, §4.3.2): copy-limited resources' hold counts,
-- with every server's own contribution beside them, so the holds of a
-- server that dies can be released by a survivor.
--
-- One pool (a copy-limited resource) lives in three keys that share the
-- hash tag of the pool's affinity A (a 64-bit hash of its name), so one
-- script call sees all of them, in Redis Cluster too:
--   KEYS[1] <prefix>{c:A}:pool  hash: n = pool name, g = global holds,
--           d:<domain> = a domain's holds, G:<group> = a group's holds,
--           s:<server>:<hold key> = what one server's sessions hold under
--           one (domain, groups) pair (the hold key is cmsgpack of
--           {domain, group, ...}), m:<server> = the sum of that server's
--           s: fields, v:<server> = the id of the operation that last
--           changed them (both present while it holds anything), so that a
--           server can tell a pool Redis lost or put back to an older
--           state,
--           x:<server> = tombstone of a dead server whose contributions
--           were released here (its value: when).
--   KEYS[2] <prefix>{c:A}:xfer  hash: transfer id -> staged copies
--           (cmsgpack {domain, copies, expires stored, base second, groups...})
--   KEYS[3] <prefix>{c:A}:xexp  sorted set: transfer id by expiry (µs)
--   KEYS[4] <prefix>{c:A}:op:<op id>  the reply of an operation already
--           applied, so that an operation sent again (its reply was lost,
--           or it timed out) is applied at most once and answers what it
--           answered the first time. Kept until the server says it has
--           the reply (below), at most ARGV[6] ms.
--   KEYS[5..] (every op but `orphans`) replies of this server's earlier
--           operations on the pool that it has received: deleted here, so
--           remembered replies cost nothing once they are not needed.
-- Counts are the sum of the servers' contributions plus the staged copies;
-- a count that reaches zero is deleted, so an idle pool leaves no key (or,
-- with tombstones, one that expires a day later).
--
-- ARGV: 1 op, 2-3 now (seconds, nanoseconds; '' for TIME), 4 this server's
-- id, 5 the pool's name, 6 how long at most to remember the operation's
-- reply (ms; '' for operations without an id), 7 the version of this
-- server's holds here as the server knows it (the id of the operation
-- that last changed them; '0' when it holds nothing), then the op's own
-- arguments (from 8). Errors (nothing
-- changed) are 'TOLLGATE <what> ...'; 'TOLLGATE lost' says Redis does not
-- have this server's holds here as the server last changed them (it lost
-- its data, or went back to an older state): the server writes its holds
-- again ('reassert') and retries.

if ARGV[2] == '' then
  local t = redis.call('TIME')
  T.init(tonumber(t[1]), tonumber(t[2]) * 1000)
else
  T.init(tonumber(ARGV[2]), tonumber(ARGV[3]))
end

local op = ARGV[1]
local sid = ARGV[4]
local pool_name = ARGV[5]
local remember = ARGV[6]
local expect_own = ARGV[7]
local P, XFER, XEXP, OPREC = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

-- Replies this server has received need not be remembered any more.
if op ~= 'orphans' then
  for i = 5, #KEYS do redis.call('DEL', KEYS[i]) end
end

-- An operation applied before answers what it answered then (`peek`
-- looks under the id of the seize it precedes, and never records).
if remember ~= '' then
  local seen = redis.call('GET', OPREC)
  if seen then return cmsgpack.unpack(seen) end
end

-- Answers `reply`, remembering it for a retry of the same operation.
local function applied(reply)
  if remember ~= '' then
    redis.call('SET', OPREC, cmsgpack.pack(reply), 'PX', remember)
  end
  return reply
end

-- Seize knows only the transfer id, whose high half is the affinity: it
-- passes no name and learns it here.
local name = redis.call('HGET', P, 'n')
if pool_name == '' then
  pool_name = name or ''
elseif name and name ~= pool_name then
  return redis.error_reply('TOLLGATE affinity_collision ' .. name)
end

local function count(field)
  return tonumber(redis.call('HGET', P, field) or '0')
end

-- Adds n (may be negative) to a count, deleting it at zero; never below 0.
local function add(field, n)
  local v = count(field) + n
  if v <= 0 then
    redis.call('HDEL', P, field)
  else
    redis.call('HSET', P, field, v)
  end
end

local function add_all(domain, groups, n)
  add('g', n)
  add('d:' .. domain, n)
  for _, g in ipairs(groups) do add('G:' .. g, n) end
end

local function hold_key(domain, groups)
  local v = { domain }
  for _, g in ipairs(groups) do v[#v + 1] = g end
  return cmsgpack.pack(v)
end

-- After the counts changed. A pool with a count ('g' is set whenever
-- anything is held or staged) keeps its name and never expires. Without
-- one, what is left is the name, deleted, or tombstones besides it: then
-- the key expires when the tombstones would be dropped, a day on.
local TOMBSTONE_S = 86400
local function tidy()
  if redis.call('HEXISTS', P, 'g') == 1 then
    redis.call('HSET', P, 'n', pool_name)
    redis.call('PERSIST', P)
  elseif redis.call('HLEN', P) == 1 and redis.call('HEXISTS', P, 'n') == 1 then
    redis.call('DEL', P)
  elseif redis.call('HLEN', P) > 0 then
    redis.call('HSET', P, 'n', pool_name)
    redis.call('PEXPIRE', P, TOMBSTONE_S * 1000)
  end
end

local function resigned()
  return redis.call('HEXISTS', P, 'x:' .. sid) == 1
end

-- This operation's id (the end of its reply's key), which becomes the
-- version of this server's holds when it changes them.
local this_op = string.match(OPREC, ':op:([^:]*)$') or '-'

-- Adds n (may be negative) to this server's own holds under a hold key,
-- and makes this operation their version (none once it holds nothing
-- here). The server keeps the version of its own holds the same way.
local function add_own(domain, groups, n)
  add('s:' .. sid .. ':' .. hold_key(domain, groups), n)
  add('m:' .. sid, n)
  if count('m:' .. sid) == 0 then
    redis.call('HDEL', P, 'v:' .. sid)
  else
    redis.call('HSET', P, 'v:' .. sid, this_op)
  end
end

-- The version of this server's holds here, as Redis has it.
local function version()
  return redis.call('HGET', P, 'v:' .. sid) or '0'
end

-- Why this server may not change its holds here, if it may not: it was
-- declared dead (a survivor released them), or Redis does not count what
-- the server knows it holds (it must write its holds again first).
local function own_refusal()
  if resigned() then return redis.error_reply('TOLLGATE resigned') end
  if version() ~= expect_own then
    return redis.error_reply('TOLLGATE lost')
  end
  return nil
end

-- Releases every staged transfer whose time has come (expires <= now).
local function expire()
  local due = redis.call('ZRANGEBYSCORE', XEXP, '-inf', T.US)
  for _, id in ipairs(due) do
    local raw = redis.call('HGET', XFER, id)
    if raw then
      local v = cmsgpack.unpack(raw)
      if T.get(v[3], v[4]) <= 0 then
        local groups = {}
        for i = 5, #v do groups[#groups + 1] = v[i] end
        add_all(v[1], groups, -v[2])
        redis.call('HDEL', XFER, id)
        redis.call('ZREM', XEXP, id)
      end
    else
      redis.call('ZREM', XEXP, id)
    end
  end
end

-- The groups listed from ARGV[from] on.
local function groups_from(from)
  local groups = {}
  for i = from, #ARGV do groups[#groups + 1] = ARGV[i] end
  return groups
end

if op == 'reserve' then
  -- 8 domain, 9 hits, 10 min_hits, 11 domain limit, 12 global limit ('' for
  -- none), then group name and limit pairs.
  local refused = own_refusal()
  if refused then return refused end
  expire()
  local domain = ARGV[8]
  local hits, min_hits = tonumber(ARGV[9]), tonumber(ARGV[10])
  local room = tonumber(ARGV[11]) - count('d:' .. domain)
  if ARGV[12] ~= '' then room = min(room, tonumber(ARGV[12]) - count('g')) end
  -- Every count stays below 2^52 whatever the limits (unconfigured ones
  -- are unbounded), so sums of counts stay exact in Lua's doubles.
  room = min(room, TWO52 - 1 - count('g'))
  local groups = {}
  local i = 13
  while i < #ARGV do
    groups[#groups + 1] = ARGV[i]
    room = min(room, tonumber(ARGV[i + 1]) - count('G:' .. ARGV[i]))
    i = i + 2
  end
  if room < 0 then room = 0 end
  local grant = grant_from_room({ hits = hits, min_hits = min_hits }, room)
  if grant.granted > 0 then
    add_all(domain, groups, grant.granted)
    add_own(domain, groups, grant.granted)
    tidy()
  end
  local allowed = 0
  if grant.allowed then allowed = 1 end
  local reply = { grant.granted, allowed, count('d:' .. domain), count('g') }
  for _, g in ipairs(groups) do reply[#reply + 1] = count('G:' .. g) end
  -- A grant of nothing changed nothing: sent again, it may decide anew.
  if grant.granted == 0 then return reply end
  return applied(reply)
end

-- Takes `copies` out of this server's holds under (domain, groups), or
-- answers how many it holds.
local function take_own(domain, groups, copies)
  local field = 's:' .. sid .. ':' .. hold_key(domain, groups)
  local held = count(field)
  if held < copies then return held end
  add_own(domain, groups, -copies)
  return nil
end

if op == 'release' then
  -- 8 domain, 9 copies, then groups.
  local refused = own_refusal()
  if refused then return refused end
  local domain, copies = ARGV[8], tonumber(ARGV[9])
  local groups = groups_from(10)
  local held = take_own(domain, groups, copies)
  if held then return redis.error_reply('TOLLGATE not_held ' .. held) end
  add_all(domain, groups, -copies)
  tidy()
  return applied(0)
end

if op == 'restore' then
  -- 8 domain, 9 copies, then groups. Counts again copies a release took
  -- after its caller was told it failed (their session still holds
  -- them), whatever the limits say now: see crates/service/src/service.rs.
  local refused = own_refusal()
  if refused then return refused end
  local domain, copies = ARGV[8], tonumber(ARGV[9])
  local groups = groups_from(10)
  add_all(domain, groups, copies)
  add_own(domain, groups, copies)
  tidy()
  return applied(0)
end

if op == 'reassert' then
  -- 8.. entries of domain, copies, group count, groups: what this server's
  -- sessions hold here. Makes this server's contribution exactly that,
  -- after Redis lost it (restarted empty) or went back to an older state
  -- (a failover to a replica that lagged, a snapshot): whatever it counts
  -- for this server now is taken away, then the entries counted. Nothing
  -- if Redis already counts exactly that total.
  if resigned() then return redis.error_reply('TOLLGATE resigned') end
  if version() == expect_own then return applied(0) end
  local prefix = 's:' .. sid .. ':'
  local fields = redis.call('HGETALL', P)
  for i = 1, #fields, 2 do
    local f = fields[i]
    if string.sub(f, 1, #prefix) == prefix then
      local v = cmsgpack.unpack(string.sub(f, #prefix + 1))
      local groups = {}
      for j = 2, #v do groups[#groups + 1] = v[j] end
      add_all(v[1], groups, -tonumber(fields[i + 1]))
      redis.call('HDEL', P, f)
    end
  end
  redis.call('HDEL', P, 'm:' .. sid)
  redis.call('HDEL', P, 'v:' .. sid)
  local total = 0
  local i = 8
  while i + 2 <= #ARGV do
    local domain, copies, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    local groups = {}
    for j = 1, n do groups[#groups + 1] = ARGV[i + 2 + j] end
    add_all(domain, groups, copies)
    add_own(domain, groups, copies)
    total = total + copies
    i = i + 3 + n
  end
  -- The version the server knows (add_own counted one per entry).
  if total > 0 then
    redis.call('HSET', P, 'v:' .. sid, expect_own)
  else
    redis.call('HDEL', P, 'v:' .. sid)
  end
  tidy()
  return applied(total)
end

if op == 'transfer' then
  -- 8 domain, 9 copies, 10 ttl (ns), 11 transfer id, then groups.
  local refused = own_refusal()
  if refused then return refused end
  local domain, copies, ttl, id = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11]
  local groups = groups_from(12)
  if redis.call('HEXISTS', XFER, id) == 1 then
    return redis.error_reply('TOLLGATE duplicate_transfer')
  end
  local held = take_own(domain, groups, copies)
  if held then return redis.error_reply('TOLLGATE not_held ' .. held) end
  local v = { domain, copies, T.put(ttl), T.S }
  for _, g in ipairs(groups) do v[#v + 1] = g end
  redis.call('HSET', XFER, id, cmsgpack.pack(v))
  -- Scored by the microsecond the copies are due, rounded down: expire()
  -- then checks the exact nanosecond.
  redis.call('ZADD', XEXP, T.US + floor((T.NS % 1000 + ttl) / 1000), id)
  tidy()
  return applied(0)
end

if op == 'peek' then
  -- 8 transfer id. Whether it is staged and not yet due: a seize looks
  -- first, so that a made-up id leaves nothing behind (not even this
  -- server's registration of the pool).
  local raw = redis.call('HGET', XFER, ARGV[8])
  if not raw then return redis.error_reply('TOLLGATE unknown_transfer') end
  local v = cmsgpack.unpack(raw)
  if T.get(v[3], v[4]) <= 0 then return redis.error_reply('TOLLGATE unknown_transfer') end
  return 1
end

if op == 'seize' then
  -- 8 transfer id. Replies the pool's name, domain, copies, expires
  -- (seconds, nanoseconds), then the groups.
  local id = ARGV[8]
  local refused = own_refusal()
  if refused then return refused end
  expire()
  local raw = redis.call('HGET', XFER, id)
  if not raw then return redis.error_reply('TOLLGATE unknown_transfer') end
  local v = cmsgpack.unpack(raw)
  redis.call('HDEL', XFER, id)
  redis.call('ZREM', XEXP, id)
  local groups = {}
  for i = 5, #v do groups[#groups + 1] = v[i] end
  add_own(v[1], groups, v[2])
  tidy()
  -- The absolute expiry, split so it stays exact: stored ns after base.
  local secs = v[4] + floor(v[3] / 1000000000)
  local reply = { pool_name, v[1], v[2], secs, v[3] - floor(v[3] / 1000000000) * 1000000000 }
  for _, g in ipairs(groups) do reply[#reply + 1] = g end
  return applied(reply)
end

if op == 'expire' then
  -- Replies how many µs until the next staged transfer is due (-1: none),
  -- so the caller comes back only then.
  expire()
  tidy()
  local next = redis.call('ZRANGE', XEXP, 0, 0, 'WITHSCORES')
  if #next == 0 then return -1 end
  return max(0, tonumber(next[2]) - T.US)
end

if op == 'cleanup' then
  -- 8 the dead server's id. Releases everything it held here and leaves a
  -- tombstone, so a server that comes back from the dead cannot reserve
  -- here again (it must resign). Tombstones older than a day are dropped.
  local dead = ARGV[8]
  local prefix = 's:' .. dead .. ':'
  redis.call('HDEL', P, 'm:' .. dead)
  redis.call('HDEL', P, 'v:' .. dead)
  local released = 0
  local fields = redis.call('HGETALL', P)
  for i = 1, #fields, 2 do
    local f = fields[i]
    if string.sub(f, 1, #prefix) == prefix then
      local n = tonumber(fields[i + 1])
      local v = cmsgpack.unpack(string.sub(f, #prefix + 1))
      local groups = {}
      for j = 2, #v do groups[#groups + 1] = v[j] end
      add_all(v[1], groups, -n)
      redis.call('HDEL', P, f)
      released = released + n
    elseif string.sub(f, 1, 2) == 'x:' and tonumber(fields[i + 1]) < T.S - TOMBSTONE_S then
      redis.call('HDEL', P, f)
    end
  end
  redis.call('HSET', P, 'x:' .. dead, T.S)
  expire()
  tidy()
  return released
end

if op == 'orphans' then
  -- KEYS[5] the live set ({srv}:alive; single Redis only, where any key
  -- may be read). Releases what servers not in it hold here: for a server
  -- starting alone against an old copy log (§4.3.2). Reading the live set
  -- here, not before the call, means a server that joined meanwhile keeps
  -- its holds.
  local live = {}
  local all = redis.call('ZRANGE', KEYS[5], 0, -1)
  for _, s in ipairs(all) do live[s] = true end
  local released = 0
  local fields = redis.call('HGETALL', P)
  for i = 1, #fields, 2 do
    local f = fields[i]
    if string.sub(f, 1, 2) == 's:' then
      local rest = string.sub(f, 3)
      local colon = string.find(rest, ':', 1, true)
      local owner = string.sub(rest, 1, colon - 1)
      if not live[owner] then
        redis.call('HDEL', P, 'm:' .. owner)
        redis.call('HDEL', P, 'v:' .. owner)
        local n = tonumber(fields[i + 1])
        local v = cmsgpack.unpack(string.sub(rest, colon + 1))
        local groups = {}
        for j = 2, #v do groups[#groups + 1] = v[j] end
        add_all(v[1], groups, -n)
        redis.call('HDEL', P, f)
        released = released + n
      end
    end
  end
  expire()
  tidy()
  return released
end

if op == 'counts' then
  -- For tests and /status: global, then domain and count pairs.
  local reply = { count('g') }
  local fields = redis.call('HGETALL', P)
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == 'd:' then
      reply[#reply + 1] = string.sub(fields[i], 3)
      reply[#reply + 1] = fields[i + 1]
    end
  end
  return reply
end

return redis.error_reply('TOLLGATE unknown_op ' .. op)
