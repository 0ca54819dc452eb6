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
-- ARGV: 1 op, 2 this server's id, 3 heartbeat TTL (ms), 4-5 op arguments.
-- Heartbeats use Redis's clock, whatever clock decisions use.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, sid, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local ALIVE, LEASE, CLEANING, POOLS, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local DEAD_S = 86400

-- Other live servers, then the dead ones (stale heartbeats and cleanups
-- left unfinished by a cleaner that died).
local function survey()
  local others = 0
  local dead = {}
  local all = redis.call('ZRANGE', ALIVE, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    if all[i] ~= sid then
      if tonumber(all[i + 1]) >= now - ttl then
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
  redis.call('ZADD', ALIVE, now, sid)
  return survey()
end

if op == 'beat' then
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
  if score and tonumber(score) >= now - ttl then return false end
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
