-- Which servers are alive, and who cleans up after the dead (Charon
-- §4.3.2, with Redis as the coordination point instead of ZooKeeper).
--
-- KEYS (one hash tag, {srv}, so this works in Redis Cluster):
--   1 <prefix>{srv}:alive     sorted set: server id by last heartbeat (ms)
--   2 <prefix>{srv}:lease     the id of the server allowed to clean up
--   3 <prefix>{srv}:cleaning  set: dead servers whose cleanup began
--   4 <prefix>{srv}:pools:<id> hash: the pool affinities where a server
--     holds copies, each with the generation of its registration (so that
--     a withdrawal that arrives late never undoes a later registration) (<id> is this server for register/unregister, the
--     dead one for claim/finish)
--   5 <prefix>{srv}:dead:<id> set while a server declared dead must stay
--     dead (a day, as long as its tombstones in the pools), so that it
--     can tell "declared dead" (it must resign) from "Redis lost my
--     heartbeat" (it restarted empty: the server joins again)
--   6 <prefix>{srv}:master   the address of the Redis master the live set
--     was last written on (Redis Sentinel only)
--   7 <prefix>{srv}:grace    set while nobody may be declared dead: the
--     grace after the live set moved to another master (below)
-- ARGV: 1 op, 2 this server's id, 3 heartbeat TTL (ms), 4-5 op arguments,
-- 6 the grace (ms) to start when the live set is found on a new master,
-- 7 the address of the master this call was sent to, as the sentinels
-- named it ('' without Sentinel: then there is never a grace).
-- Heartbeats use Redis's clock, whatever clock decisions use.
--
-- Why a grace. A master that dies silently is failed over only after the
-- sentinels' down-after-milliseconds (30 s by default), usually longer
-- than the heartbeat TTL; no server could beat meanwhile, so on the
-- promoted replica every heartbeat is stale, the dead servers' and the
-- live ones' alike. Declaring them dead would release live servers' holds
-- and make them resign. So the first `join` or `beat` that names a master
-- other than the one recorded starts a grace (ARGV[6] ms, from the
-- server: a heartbeat TTL plus the longest a live server takes to follow
-- the sentinels there), during which a stale heartbeat counts as alive
-- and nobody is claimed; every live server beats as soon as it follows.
-- After the grace, a server still stale is dead, as always.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, sid, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ALIVE, LEASE, CLEANING, POOLS, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local MASTER, GRACE = KEYS[6], KEYS[7]
local grace_ms, master = tonumber(ARGV[6]) or 0, ARGV[7] or ''
local DEAD_S = 86400

-- Records the master this call reached, and starts the grace when the
-- live set was last written on another one (a failover). A live set with
-- no master recorded (the first Sentinel call, or Redis lost it) starts
-- none: nothing in it was written elsewhere.
local function moved()
  if master == '' then return end
  local was = redis.call('GET', MASTER)
  if was == master then return end
  redis.call('SET', MASTER, master)
  if was and grace_ms > 0 then
    redis.call('SET', GRACE, was, 'PX', grace_ms)
  end
end

local function in_grace()
  return redis.call('EXISTS', GRACE) == 1
end

-- Other live servers, then the dead ones (stale heartbeats and cleanups
-- left unfinished by a cleaner that died).
local function survey()
  local others = 0
  local dead = {}
  local grace = in_grace()
  local all = redis.call('ZRANGE', ALIVE, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    if all[i] ~= sid then
      if grace or tonumber(all[i + 1]) >= now - ttl then
        others = others + 1
      else
        dead[#dead + 1] = all[i]
      end
    end
  end
  for _, d in ipairs(redis.call('SMEMBERS', CLEANING)) do dead[#dead + 1] = d end
  local reply = { others }
  for _, d in ipairs(dead) do reply[#reply + 1] = d end
  return reply
end

if op == 'join' then
  moved()
  redis.call('ZADD', ALIVE, now, sid)
  return survey()
end

if op == 'beat' then
  moved()
  -- A server that was declared dead stays dead: its holds are gone.
  if redis.call('EXISTS', DEAD) == 1 then return { -1 } end
  if not redis.call('ZSCORE', ALIVE, sid) then
    -- Not in the live set, yet nobody declared it dead: Redis lost the
    -- set (restarted empty, flushed). It joins again and says so (-2
    -- first), so it counts its holds again where Redis lost them.
    redis.call('ZADD', ALIVE, now, sid)
    local reply = survey()
    table.insert(reply, 1, -2)
    return reply
  end
  redis.call('ZADD', ALIVE, now, sid)
  return survey()
end

if op == 'register' then
  -- Replies 1 if it had to join again (as `beat` does), else 0.
  if redis.call('EXISTS', DEAD) == 1 then
    return redis.error_reply('TOLLGATE resigned')
  end
  local rejoined = 0
  if not redis.call('ZSCORE', ALIVE, sid) then
    redis.call('ZADD', ALIVE, now, sid)
    rejoined = 1
  end
  -- ARGV[4] the pool, ARGV[5] this registration's generation.
  redis.call('HSET', POOLS, ARGV[4], ARGV[5])
  return rejoined
end

if op == 'unregister' then
  -- The server holds nothing in pool ARGV[4] any more, as of its
  -- registration ARGV[5]; a later registration stays.
  if redis.call('HGET', POOLS, ARGV[4]) == ARGV[5] then
    redis.call('HDEL', POOLS, ARGV[4])
  end
  return 0
end

if op == 'claim' then
  -- One cleaner at a time: the lease holder. A dead server is removed
  -- from the live set here, atomically with the check that its heartbeat
  -- is still stale, so it cannot come back and keep reserving.
  local dead = ARGV[4]
  local holder = redis.call('GET', LEASE)
  if holder and holder ~= sid then return false end
  redis.call('SET', LEASE, sid, 'PX', ttl)
  local score = redis.call('ZSCORE', ALIVE, dead)
  if score and (in_grace() or tonumber(score) >= now - ttl) then return false end
  redis.call('ZREM', ALIVE, dead)
  redis.call('SADD', CLEANING, dead)
  redis.call('SET', DEAD, now, 'EX', DEAD_S)
  return redis.call('HKEYS', POOLS)
end

if op == 'finish' then
  redis.call('DEL', POOLS)
  redis.call('SREM', CLEANING, ARGV[4])
  return 0
end

if op == 'leave' then
  redis.call('ZREM', ALIVE, sid)
  redis.call('DEL', POOLS)
  return 0
end

return redis.error_reply('TOLLGATE unknown_op ' .. op)
